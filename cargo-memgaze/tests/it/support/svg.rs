//! Checks on rendered charts: parse the SVG, list its texts, render it to
//! PNG with resvg (which proves the document is valid and drawable).
//!
//! Set `MEMGAZE_CHART_PREVIEW=<dir>` to keep the PNGs for a look.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

/// Every `<text>` element's content, in document order.
pub fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the chart is well-formed XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

/// Elements with tag `name`.
pub fn count(svg: &str, name: &str) -> usize {
    let doc = roxmltree::Document::parse(svg).expect("the chart is well-formed XML");
    doc.descendants().filter(|n| n.has_tag_name(name)).count()
}

/// Asserts that each of `expected` is the content of some text element.
pub fn assert_texts(svg: &str, expected: &[&str]) {
    let found = texts(svg);
    for e in expected {
        assert!(
            found.iter().any(|t| t == e),
            "no text {e:?} in the chart; texts: {found:?}"
        );
    }
}

/// Asserts that some text element contains `fragment`.
pub fn assert_text_containing(svg: &str, fragment: &str) {
    let found = texts(svg);
    assert!(
        found.iter().any(|t| t.contains(fragment)),
        "no text containing {fragment:?}; texts: {found:?}"
    );
}

fn fonts() -> Arc<resvg::usvg::fontdb::Database> {
    static FONTS: OnceLock<Arc<resvg::usvg::fontdb::Database>> = OnceLock::new();
    FONTS
        .get_or_init(|| {
            let mut db = resvg::usvg::fontdb::Database::new();
            db.load_system_fonts();
            db.set_sans_serif_family("DejaVu Sans");
            Arc::new(db)
        })
        .clone()
}

/// Renders the chart to PNG; returns the PNG bytes and checks the image
/// is not blank. Keeps it as `<preview>/<name>.png` when asked to.
pub fn render_png(svg: &str, name: &str) -> Vec<u8> {
    let options = resvg::usvg::Options {
        fontdb: fonts(),
        ..resvg::usvg::Options::default()
    };
    let tree = resvg::usvg::Tree::from_str(svg, &options).expect("usvg parses the chart");
    let size = tree.size().to_int_size();
    assert!(size.width() > 100 && size.height() > 100);
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let ink = pixmap
        .pixels()
        .iter()
        .filter(|p| p.red() < 200 || p.green() < 200 || p.blue() < 200)
        .count();
    assert!(ink > 500, "{name}: the rendered chart is (nearly) blank");
    let png = pixmap.encode_png().expect("PNG encoding");
    if let Some(dir) = std::env::var_os("MEMGAZE_CHART_PREVIEW") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
        std::fs::write(dir.join(format!("{name}.svg")), svg).unwrap();
    }
    png
}
