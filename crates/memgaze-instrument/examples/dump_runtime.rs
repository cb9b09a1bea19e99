//! Prints the generated recording runtime as Intel-syntax assembly, with
//! the addresses of its entry points: a reading aid when changing
//! `rewrite::runtime`.
//!
//! ```text
//! cargo run -p memgaze-instrument --example dump_runtime
//! ```

use memgaze_instrument::rewrite::runtime as runtime_module;

fn main() {
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};
    let rt = runtime_module::generate(&runtime_module::RuntimeParams {
        code_va: 0x10_0000,
        header_va: 0x10_0000 - 64,
        state_va: 0x20_0000,
        original_entry: 0x1040,
        original_fini: Some(0x1200),
        has_regions: false,
        escape_sites: 0,
        cpu_features: 0,
    })
    .unwrap();
    let mut d = Decoder::with_ip(64, &rt.code, 0x10_0000, DecoderOptions::NONE);
    let mut f = IntelFormatter::new();
    let mut s = String::new();
    while d.can_decode() {
        let i = d.decode();
        s.clear();
        f.format(&i, &mut s);
        println!("{:x} {}", i.ip(), s);
    }
    println!(
        "{:x?}",
        (rt.record, rt.entry, rt.fini, rt.region_begin, rt.region_end)
    );
}
