//! The `doctor` and `pt-decode` commands through the built binary.

use memgaze_record::pt::encode::{IpEncoder, encode};
use memgaze_record::pt::packet::Packet;
use std::process::Output;

fn memgaze(args: &[&str]) -> Output {
    crate::support::memgaze_command()
        .args(args)
        .output()
        .expect("run cargo-memgaze")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether this machine exposes a ptwrite-capable Intel PT PMU at all.
fn machine_has_ptwrite() -> bool {
    std::fs::read_to_string("/sys/bus/event_source/devices/intel_pt/caps/ptwrite")
        .is_ok_and(|s| s.trim() == "1")
}

#[test]
fn doctor_reports_every_check_with_a_reason_and_the_auto_choice() {
    let o = memgaze(&["doctor"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for name in [
        "intel_pt_pmu",
        "ptwrite",
        "pt_config",
        "psb_cyc",
        "kernel",
        "perf_permissions",
        "mlock",
        "load_event",
        "aux_sampling",
        "architecture",
        "self_test",
    ] {
        assert!(text.contains(name), "no {name} in\n{text}");
    }
    assert!(text.contains("--backend auto picks"), "{text}");
    if !machine_has_ptwrite() {
        assert!(
            text.contains("Intel PT backend (--backend pt): unusable"),
            "{text}"
        );
        assert!(text.contains("--backend auto picks soft"), "{text}");
    }

    let o = memgaze(&["doctor", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["schema"], "memgaze.doctor.v1");
    assert_eq!(json["backends"][0]["backend"], "pt");
    assert_eq!(json["backends"][1]["backend"], "soft");
    for check in json["backends"][0]["checks"].as_array().unwrap() {
        assert!(!check["detail"].as_str().unwrap().is_empty(), "{check}");
    }
    if !machine_has_ptwrite() {
        assert_eq!(json["backends"][0]["usable"], false);
        assert_eq!(json["auto"]["backend"], "soft");
    }
    // The software recorder's self-test really instruments and records a
    // program (`true`), and passes here.
    let self_test = json["backends"][1]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "self_test")
        .unwrap();
    assert_eq!(self_test["status"], "pass", "{self_test}");
    assert!(
        self_test["detail"]
            .as_str()
            .unwrap()
            .contains("same output and exit status"),
        "{self_test}"
    );
    assert_eq!(json["backends"][1]["usable"], true);
}

/// Every recording command resolves `--backend` the same way: an explicit
/// `pt` on a machine without it is one line and exit 1, before anything
/// runs; `auto` says it chose the software recorder.
#[test]
fn recording_commands_refuse_an_unusable_pt_backend_in_one_line() {
    if machine_has_ptwrite() {
        return;
    }
    let tmp = std::env::temp_dir();
    let tmp = tmp.to_str().unwrap();
    for args in [
        vec!["run", "--backend", "pt", "/bin/true"],
        vec!["record", "--backend", "pt", "/bin/true"],
        vec![
            "bench",
            "--backend",
            "pt",
            "--manifest-path",
            "/nonexistent/Cargo.toml",
        ],
        vec![
            "golden",
            "--backend",
            "pt",
            "--manifest-path",
            "/nonexistent/Cargo.toml",
        ],
        vec![
            "validate",
            "--backend",
            "pt",
            "--manifest-path",
            "/nonexistent/Cargo.toml",
        ],
    ] {
        let o = crate::support::memgaze_command()
            .args(&args)
            .current_dir(tmp)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(
            err.starts_with("error: --backend pt: Intel PT is unusable on this machine: "),
            "{args:?}: {err}"
        );
    }
    let o = memgaze(&["run", "/bin/true"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("auto: software recorder, because Intel PT is unusable"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn explicit_pt_on_a_machine_without_it_fails_with_one_line_and_exit_1() {
    let o = memgaze(&["doctor", "--backend", "pt"]);
    if machine_has_ptwrite() {
        // On a PT machine this may pass; nothing more to check here.
        return;
    }
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(
        err.starts_with("error: --backend pt: Intel PT is unusable on this machine: "),
        "{err}"
    );
    assert!(stdout(&o).is_empty());

    let o = memgaze(&["doctor", "--backend", "auto"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).starts_with("soft: auto: software recorder"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn pt_decode_prints_ptw_events_and_counts() {
    let mut s = vec![0xff, 0x00, 0x19]; // torn head
    let mut ips = IpEncoder::default();
    encode(&Packet::Psb, &mut s);
    encode(&Packet::Tsc(0xabcdef), &mut s);
    encode(&Packet::Fup(ips.compress(0x5555_0000_1000)), &mut s);
    encode(&Packet::PsbEnd, &mut s);
    encode(
        &Packet::Ptw {
            payload: 0x7ffd_1234_5678,
            size: 8,
            ip: true,
        },
        &mut s,
    );
    encode(&Packet::Fup(ips.compress(0x5555_0000_1042)), &mut s);
    encode(&Packet::Ovf, &mut s);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("raw.pt");
    std::fs::write(&file, &s).unwrap();
    let path = file.to_str().unwrap();

    let o = memgaze(&["pt-decode", path]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("0x7ffd12345678"), "{text}");
    assert!(text.contains("0x555500001042"), "{text}");
    assert!(text.contains("0xabcdef"), "{text}");
    assert!(text.contains("1 overflows"), "{text}");
    assert!(text.contains("3 bytes skipped"), "{text}");

    let o = memgaze(&["pt-decode", path, "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["ptw"][0]["payload"], "0x7ffd12345678");
    assert_eq!(json["ptw"][0]["ip"], "0x555500001042");
    assert_eq!(json["ptw"][0]["tsc"], 0xabcdef);
    assert_eq!(json["packets"]["PTW"], 1);
    assert_eq!(json["overflows"].as_array().unwrap().len(), 1);
}

#[test]
fn pt_decode_bad_input_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, b"definitely not processor trace").unwrap();
    for path in [junk.to_str().unwrap(), "/nonexistent/raw.pt"] {
        let o = memgaze(&["pt-decode", path]);
        assert_eq!(o.status.code(), Some(1));
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: ") && err.contains(path), "{err}");
    }
}
