//! Renders report charts to PNG for a look (resvg, the renderer the chart
//! tests use): every `*.svg` under a report directory, or the files named.
//!
//! ```sh
//! cargo run -p cargo-memgaze --example chart_png -- target/memgaze/report /tmp/charts
//! ```
//!
//! PNGs keep the SVG's relative path with `/` replaced by `__`.

use std::path::{Path, PathBuf};

fn svgs(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            svgs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "svg") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [input, output] = args.as_slice() else {
        return Err("usage: chart_png <REPORT-DIR | FILE.svg> <OUT-DIR>".into());
    };
    let mut files = Vec::new();
    if input.is_dir() {
        svgs(input, &mut files)?;
    } else {
        files.push(input.clone());
    }
    files.sort();
    std::fs::create_dir_all(output)?;
    let mut fonts = resvg::usvg::fontdb::Database::new();
    fonts.load_system_fonts();
    fonts.set_sans_serif_family("DejaVu Sans");
    let options = resvg::usvg::Options {
        fontdb: std::sync::Arc::new(fonts),
        ..resvg::usvg::Options::default()
    };
    for file in &files {
        let svg = std::fs::read_to_string(file)?;
        let tree = resvg::usvg::Tree::from_str(&svg, &options)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        let size = tree.size().to_int_size();
        let mut pixmap =
            resvg::tiny_skia::Pixmap::new(size.width(), size.height()).ok_or("empty chart")?;
        pixmap.fill(resvg::tiny_skia::Color::WHITE);
        resvg::render(&tree, Default::default(), &mut pixmap.as_mut());
        let name = file
            .strip_prefix(input)
            .unwrap_or(file)
            .with_extension("png")
            .to_string_lossy()
            .replace('/', "__");
        let name = if name.is_empty() {
            "chart.png".into()
        } else {
            name
        };
        let png = output.join(name);
        pixmap.save_png(&png)?;
        println!("{}", png.display());
    }
    Ok(())
}
