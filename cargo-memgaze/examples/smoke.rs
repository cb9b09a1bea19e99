use memgaze::record::{self, RecordSink};
use std::path::Path;
struct Null(u64);
impl RecordSink for Null { fn begin_sample(&mut self, _t: u32) -> anyhow::Result<()> { Ok(()) } fn switch_thread(&mut self, _t: u32) -> anyhow::Result<()> { Ok(()) } fn push(&mut self, _l: u32, _a: u64) -> anyhow::Result<()> { self.0 += 1; Ok(()) } }
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bytes = std::fs::read(&args[1]).unwrap();
    let out = memgaze::instrument::runtime_only(bytes, false).unwrap();
    std::fs::write(&args[2], &out).unwrap();
    std::fs::set_permissions(&args[2], std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ann = memgaze::annotation::Annotation { schema: "x".into(), binary: memgaze::trace::BinaryIdentity { path: "x".into(), size: 0, sha256: String::new(), build_id: None }, mode: None, functions: vec![], loads: vec![] };
    let mut sink = Null(0);
    let rec = record::record(Path::new(&args[2]), &args[3..].iter().map(Into::into).collect::<Vec<_>>(), &ann, &memgaze::trace::Sampling { window: 1000, period: 100000, seed: Some(1) }, &mut sink).unwrap();
    eprintln!("{:?}", rec);
}
