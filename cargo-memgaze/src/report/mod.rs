//! SVG charts and the HTML report.
