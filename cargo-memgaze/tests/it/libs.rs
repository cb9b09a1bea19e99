//! Shared libraries instrumented with `--libs`: a C program whose work is
//! mostly libc's `memcpy`, `memcmp` and `strlen` on large buffers, recorded
//! with libc instrumented (`--full`) and checked per function against
//! Valgrind Lackey on the original program and libc.
//!
//! glibc picks string-function variants by CPU; Valgrind has neither
//! AVX-512 nor Intel's transactional memory (RTM: such CPUs get the `_rtm`
//! variants, or with RTM off the SSE2 ones unless `Prefer_No_VZEROUPPER`,
//! set for them, is off too), so the native run is told to ignore them
//! too (`GLIBC_TUNABLES`) and both run the same variants. The
//! non-temporal threshold is pinned above the buffers, since it follows
//! the cache sizes each CPU (or Valgrind) reports. The program prints where the loader put it and
//! libc (stderr, fixed width: the same output in every run), which turns
//! Lackey's addresses into offsets of each object. Only the loop between
//! the region markers is compared: start-up reads the environment, which
//! differs under Valgrind (`LD_PRELOAD`) and the recorder (its variables).
//!
//! String instructions (`rep movsb` of `memcpy` for large sizes) are loads
//! like the others: one record per element, as Lackey sees one read per
//! iteration. Counted apart: the implicit stack reads (`pop`, `ret`), which
//! are not traced; the 99% holds with them in the denominator too.

use super::rewriter_support::{build, memgaze, run_ok, scratch};
use memgaze_metadata::annotation::Annotation;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const TUNABLES: &str = "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AVX512_VBMI2,-RTM,-Prefer_No_VZEROUPPER:glibc.cpu.x86_non_temporal_threshold=0x40000000";
/// Buffer bytes: large enough that the copies, comparisons and scans are
/// most of the program's loads.
const BYTES: &str = "262144";
const LIBC: &str = "libc.so.6";

/// `base <hex> main|libc` lines of the program's stderr.
fn bases(stderr: &[u8]) -> HashMap<String, u64> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("base ")?.split(' ');
            let base = u64::from_str_radix(words.next()?, 16).ok()?;
            Some((words.next()?.to_string(), base))
        })
        .collect()
}

/// Reads per instruction (absolute address) between the region markers
/// (every ` L`/` M` of an execution, a `cmps` has two, except one repeating
/// the address just read, `xchg`'s load and modify) (offsets `markers` in the
/// executable, whose base the program prints first), streamed from
/// Lackey's log; the program's stderr.
fn lackey_executions(program: &Path, markers: (u64, u64)) -> (HashMap<u64, u64>, Vec<u8>) {
    let mut valgrind = lackey();
    valgrind
        .arg(program)
        .arg(BYTES)
        .env("GLIBC_TUNABLES", TUNABLES);
    // A PIE under Valgrind (amd64) starts at 0x108000.
    let window = (0x108000 + markers.0, 0x108000 + markers.1);
    lackey_reads(valgrind, "libc_strings", Some(window))
}

/// `valgrind --tool=lackey --trace-mem=yes`, its log on stdout.
fn lackey() -> Command {
    let mut valgrind = Command::new("valgrind");
    valgrind.args(["--tool=lackey", "--trace-mem=yes", "--log-fd=1", "-q"]);
    valgrind
}

/// Reads per instruction (absolute address) of the Lackey run `valgrind`
/// (see [`lackey_executions`] for what counts), between the instructions at
/// `window`'s two addresses or over the whole run; its stderr, kept in
/// `<name>.lackey.stderr`.
fn lackey_reads(
    mut valgrind: Command,
    name: &str,
    window: Option<(u64, u64)>,
) -> (HashMap<u64, u64>, Vec<u8>) {
    let stderr_file = scratch().join(format!("{name}.lackey.stderr"));
    let mut child = valgrind
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_file).unwrap())
        .spawn()
        .expect("valgrind is required");
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let mut ip = None;
    let mut last: Option<u64> = None;
    let mut inside = window.is_none();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("I  ") {
            ip = u64::from_str_radix(rest.split(',').next().unwrap(), 16).ok();
            last = None;
            if let (Some(a), Some((begin, end))) = (ip, window) {
                inside = match a {
                    a if a == begin => true,
                    a if a == end => false,
                    _ => inside,
                };
            }
        } else if inside
            && (line.starts_with(" L ") || line.starts_with(" M "))
            && let Some(ip) = ip
        {
            let addr = u64::from_str_radix(line[3..].split(',').next().unwrap(), 16).ok();
            if last.is_none() || last != addr {
                *counts.entry(ip).or_default() += 1;
            }
            last = addr;
        }
    }
    assert!(child.wait().unwrap().success());
    (counts, std::fs::read(&stderr_file).unwrap())
}

/// The annotation of the cached instrumented copy named `name`.
fn cached_annotation(cache: &Path, name: &str) -> Annotation {
    let file = format!("{name}.memgaze.json");
    let path: PathBuf = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path().join(&file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no {file} under {}", cache.display()));
    Annotation::read(&path).unwrap()
}

/// Function name of `ip` in `annotation`.
fn function_at(annotation: &Annotation, ip: u64) -> String {
    annotation
        .functions
        .iter()
        .find(|f| f.start <= ip && ip < f.start + f.size)
        .map_or_else(|| "?".to_string(), |f| f.name.clone())
}

#[test]
fn libc_string_functions_are_traced_as_lackey_sees_them() {
    let program = build("libc_strings.c", &["-O2", "-g"]);
    let native = run_ok(
        Command::new(&program)
            .arg(BYTES)
            .env("GLIBC_TUNABLES", TUNABLES),
    );
    // The instrumented copies are cached in this target directory.
    let target = scratch().join("libs-target");
    std::fs::create_dir_all(&target).unwrap();
    let json = scratch().join("libc_strings.json");
    let ours = run_ok(
        memgaze()
            .args([
                "memgaze", "run", "-q", "--full", "--libs", LIBC, "--format", "json", "-o",
            ])
            .arg(&json)
            .arg(&program)
            .arg(BYTES)
            .env("GLIBC_TUNABLES", TUNABLES)
            .env("CARGO_TARGET_DIR", &target)
            // This project's cache, not the test run's.
            .env_remove("MEMGAZE_LIBS_CACHE"),
    );
    assert_eq!(
        ours.stdout, native.stdout,
        "output differs with libc instrumented"
    );
    let analysis: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cache = target.join("memgaze").join("instrumented");
    let exe_name = program.file_name().unwrap().to_string_lossy().into_owned();
    let objects = [
        (
            "main",
            exe_name.clone(),
            cached_annotation(&cache, &exe_name),
        ),
        ("libc", LIBC.to_string(), cached_annotation(&cache, LIBC)),
    ];
    // Our counts per (object, ip).
    let mut recorded: HashMap<(String, u64), u64> = HashMap::new();
    for load in analysis["loads"].as_array().unwrap() {
        let ip =
            u64::from_str_radix(load["ip"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        let object = load["object"]
            .as_str()
            .expect("every load names its object");
        *recorded.entry((object.to_string(), ip)).or_default() += load["count"].as_u64().unwrap();
    }
    let marker = |name: &str| {
        objects[0]
            .2
            .functions
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.start)
            .unwrap()
    };
    let markers = (marker("memgaze_region_begin"), marker("memgaze_region_end"));
    let (lackey, stderr) = lackey_executions(&program, markers);
    assert_eq!(
        bases(&stderr)["main"],
        0x108000,
        "Valgrind moved the executable"
    );
    let bases = bases(&stderr);
    // Per object and function: (Lackey's loads, ours up to
    // Lackey's, ours); Lackey's implicit reads per object.
    let mut per_function: BTreeMap<(String, String), (u64, u64, u64)> = BTreeMap::new();
    let mut implicit: BTreeMap<String, u64> = BTreeMap::new();
    for (tag, object, annotation) in &objects {
        let base = bases[*tag];
        let size = annotation
            .functions
            .iter()
            .map(|f| f.start + f.size)
            .max()
            .unwrap();
        let explicit: HashSet<u64> = annotation.loads.iter().map(|l| l.ip).collect();
        for (&ip, &n) in &lackey {
            let Some(offset) = ip.checked_sub(base).filter(|&o| o < size) else {
                continue;
            };
            if !explicit.contains(&offset) {
                *implicit.entry(object.clone()).or_default() += n;
                continue;
            }
            let ours = recorded
                .get(&(object.clone(), offset))
                .copied()
                .unwrap_or(0);
            let row = per_function
                .entry((object.clone(), function_at(annotation, offset)))
                .or_default();
            row.0 += n;
            row.1 += ours.min(n);
            row.2 += ours;
        }
    }
    let lackey_total: u64 = per_function.values().map(|r| r.0).sum();
    let ours_total: u64 = per_function.values().map(|r| r.1).sum();
    let mut rows: Vec<_> = per_function.iter().collect();
    rows.sort_by_key(|(_, r)| std::cmp::Reverse(r.0));
    for ((object, function), (l, _, o)) in rows.iter().take(12) {
        eprintln!("{object:>12} {function:<32} Lackey {l:>9}  ours {o:>9}");
    }
    let implicit_total: u64 = implicit.values().sum();
    eprintln!(
        "loads: ours {ours_total} of Lackey's {lackey_total} ({:.2}%); implicit stack reads Lackey sees (not traced): {implicit:?}",
        100.0 * ours_total as f64 / lackey_total as f64
    );
    for ((object, function), (l, _, o)) in &per_function {
        assert!(o <= l, "{object} {function}: {o} recorded, Lackey saw {l}");
    }
    assert!(
        ours_total as f64 >= 0.99 * lackey_total as f64,
        "{ours_total} of Lackey's {lackey_total} loads recorded"
    );
    assert!(
        ours_total as f64 >= 0.99 * (lackey_total + implicit_total) as f64,
        "{ours_total} of Lackey's {lackey_total} loads and {implicit_total} implicit reads recorded"
    );
    // memcpy's `rep movsb` is traced: Lackey's reads of its largest
    // function are all there. Counted per function, not per instruction:
    // on Intel CPUs with FSRM glibc avoids short-distance `rep movsb`
    // (Valgrind hides FSRM), which reaches the same `rep movsb` through a
    // copy of the first vector load at another address.
    let ((_, memcpy_name), memcpy) = per_function
        .iter()
        .filter(|((object, _), _)| object == LIBC)
        .max_by_key(|(_, r)| r.0)
        .unwrap();
    assert!(memcpy.0 >= 1_000_000, "{memcpy:?}");
    let libc_annotation = &objects[1].2;
    let ours_in_memcpy: u64 = recorded
        .iter()
        .filter(|((object, ip), _)| {
            object == LIBC && function_at(libc_annotation, *ip) == *memcpy_name
        })
        .map(|(_, &n)| n)
        .sum();
    assert_eq!(ours_in_memcpy, memcpy.0, "{memcpy_name}");
    // The copies, comparisons and scans themselves are libc's, and traced.
    let libc_share: u64 = per_function
        .iter()
        .filter(|((object, _), _)| object == LIBC)
        .map(|(_, r)| r.1)
        .sum();
    assert!(
        libc_share * 10 > ours_total * 9,
        "{libc_share} of {ours_total} in libc"
    );
}

/// A system program run natively and through `cargo memgaze run --libs
/// <libs>` (`sampling` flags), bounded by `timeout`: the same stdout and
/// exit status. `None` (with a message saying so) when the
/// program is not installed.
fn same_with_libraries(
    program: &str,
    args: &[&str],
    stdin: &Path,
    libs: &str,
    sampling: &[&str],
) -> Option<()> {
    let path = Path::new(program);
    if !path.is_file() {
        eprintln!("SKIPPED: {program} is not installed (ci/test.sh installs it)");
        return None;
    }
    let target = scratch().join("libs-system-target");
    std::fs::create_dir_all(&target).unwrap();
    let native = Command::new(path)
        .args(args)
        .stdin(std::fs::File::open(stdin).unwrap())
        .env("HOME", scratch())
        .output()
        .unwrap();
    // A program that loops in an instrumented library is stopped here,
    // not left to hang the test run.
    let ours = Command::new("timeout")
        .arg("600")
        .arg(env!("CARGO_BIN_EXE_cargo-memgaze"))
        .env("MEMGAZE_LIBS_CACHE", crate::support::LIBS_CACHE)
        .args(["memgaze", "run", "-q", "--libs", libs, "-o"])
        .arg(scratch().join(format!("{}.analysis", path.file_name().unwrap().display())))
        .args(sampling)
        .arg(path)
        .args(args)
        .stdin(std::fs::File::open(stdin).unwrap())
        .env("HOME", scratch())
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let what = format!("{program} --libs {libs} {sampling:?}");
    assert_eq!(
        String::from_utf8_lossy(&ours.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{what}: stdout differs; stderr: {}",
        String::from_utf8_lossy(&ours.stderr)
    );
    assert_eq!(
        ours.status.code(),
        native.status.code(),
        "{what}: exit status differs; stderr: {}",
        String::from_utf8_lossy(&ours.stderr)
    );
    Some(())
}

/// sqlite3 runs a query script with libc instrumented as it runs alone.
/// Its start-up looks the user up in `/etc/nsswitch.conf`, parsed with
/// `strncasecmp`, whose AVX2/EVEX variants fall through from one symbol into
/// the next (`__strncasecmp_avx2` into `__strncasecmp_l_avx2`).
#[test]
fn sqlite3_runs_a_query_script_with_libc_instrumented() {
    let script = scratch().join("queries.sql");
    std::fs::write(
        &script,
        "create table t(id integer primary key, name text, score real);\n\
         with recursive n(i) as (select 1 union all select i + 1 from n where i < 2000)\n\
         insert into t select i, printf('name-%05d', (i * 7919) % 2000), i * 0.37 from n;\n\
         create index t_name on t(name);\n\
         select count(*), sum(score), min(name), max(name) from t;\n\
         select name, printf('%.3f', score) from t where name like 'NAME-01%' order by name limit 5;\n\
         select upper(name), length(name) from t order by score desc limit 3;\n\
         select id % 7 as k, count(*), group_concat(id % 3, '') from t group by k order by k;\n\
         select * from missing_table;\n\
         select 'after the error';\n",
    )
    .unwrap();
    for sampling in [&[][..], &["--full"][..]] {
        if same_with_libraries("/usr/bin/sqlite3", &[":memory:"], &script, LIBC, sampling).is_none()
        {
            return;
        }
    }
}

/// python3 runs a small script with every library it loads instrumented,
/// twice: the first run names the libraries it `dlopen`s (`_hashlib`'s
/// libcrypto among them), the second loads their instrumented copies
/// (stripped libcrypto keeps SHA-256 constants between its functions, which
/// the rewriter must leave unpatched).
#[test]
fn python3_runs_a_script_with_its_libraries_instrumented() {
    let script = scratch().join("script.py");
    std::fs::write(
        &script,
        "import json, re, hashlib, zlib, math\n\
         words = [f'w{(i * 7919) % 1000:04d}' for i in range(5000)]\n\
         counts = {}\n\
         for w in words:\n    counts[w] = counts.get(w, 0) + 1\n\
         top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]\n\
         print(json.dumps(top))\n\
         print(len(re.findall(r'w0[0-4]\\d\\d', ' '.join(words))))\n\
         print(hashlib.sha256(' '.join(words).encode()).hexdigest())\n\
         print(len(zlib.compress(' '.join(words).encode())), f'{math.fsum(math.sqrt(i) for i in range(1000)):.6f}')\n",
    )
    .unwrap();
    let empty = scratch().join("empty-stdin");
    std::fs::write(&empty, "").unwrap();
    let script = script.to_string_lossy().into_owned();
    for _run in 0..2 {
        if same_with_libraries("/usr/bin/python3", &[&script], &empty, "*", &[]).is_none() {
            return;
        }
    }
}

/// Coverage by object on a program whose work is libc's: with `--libs
/// none` libc is listed as not instrumented, its loads unknown (null, not
/// zero); with libc instrumented its row is traced and holds most of the
/// executed loads, and the executable's own row is unchanged.
#[test]
fn coverage_by_object_says_whether_libc_was_traced() {
    let program = build("libc_strings.c", &["-O2", "-g"]);
    let target = scratch().join("libs-coverage-target");
    std::fs::create_dir_all(&target).unwrap();
    let exe = program.file_name().unwrap().to_string_lossy().into_owned();
    let rows = |libs: &str| -> Vec<serde_json::Value> {
        let json = scratch().join(format!("coverage-libs-{libs}.json"));
        run_ok(
            memgaze()
                .args(["memgaze", "run", "-q", "--full", "--libs", libs])
                .args(["--format", "json", "-o"])
                .arg(&json)
                .arg(&program)
                .arg("65536")
                .env("CARGO_TARGET_DIR", &target),
        );
        let analysis: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        analysis["summary"]["coverage_by_object"]
            .as_array()
            .unwrap_or_else(|| panic!("no coverage_by_object: {}", analysis["summary"]))
            .clone()
    };
    let row = |rows: &[serde_json::Value], object: &str| {
        rows.iter()
            .find(|r| r["object"] == object)
            .unwrap_or_else(|| panic!("no row for {object}: {rows:?}"))
            .clone()
    };
    let none = rows("none");
    let (app, libc) = (row(&none, &exe), row(&none, LIBC));
    assert_eq!(app["instrumented"], true, "{none:?}");
    assert!(app["loads_traced"].as_f64().unwrap() > 0.0, "{none:?}");
    assert!(app["share"].as_f64().unwrap() > 0.99, "{none:?}");
    assert_eq!(libc["instrumented"], false, "{none:?}");
    assert_eq!(libc["loads_traced"].as_f64(), Some(0.0), "{none:?}");
    assert!(libc["loads_executed"].is_null(), "{none:?}");
    assert!(libc["share"].is_null(), "{none:?}");

    let traced = rows(LIBC);
    let (app_traced, libc_traced) = (row(&traced, &exe), row(&traced, LIBC));
    assert_eq!(libc_traced["instrumented"], true, "{traced:?}");
    let libc_loads = libc_traced["loads_traced"].as_f64().unwrap();
    assert!(
        libc_loads > app_traced["loads_traced"].as_f64().unwrap(),
        "the work is libc's: {traced:?}"
    );
    assert!(libc_traced["share"].as_f64().unwrap() > 0.9, "{traced:?}");
    assert_eq!(
        traced[0]["object"], LIBC,
        "most executed loads first: {traced:?}"
    );
    assert_eq!(
        app_traced["loads_traced"], app["loads_traced"],
        "the executable's own loads do not depend on --libs"
    );
}

/// libc's load executions do not depend on the recorder's settings: a full
/// run, a sampled one and sampled ones with seeds of one and twenty digits
/// execute the same loads, counted exactly by the runtime. The program
/// reads every environment string byte by byte through libc, as glibc's
/// start-up reads them, so the recorder's variables must have the same
/// length whatever the settings.
#[test]
fn libc_executions_are_the_same_in_full_and_sampled_runs() {
    let program = build("env_strings.c", &["-O2", "-g"]);
    let target = scratch().join("libs-settings-target");
    std::fs::create_dir_all(&target).unwrap();
    let executions = |tag: &str, settings: &[&str]| -> u64 {
        let trace = scratch().join(format!("libs-settings-{tag}.trace"));
        run_ok(
            memgaze()
                .args(["memgaze", "run", "-q", "--libs", LIBC])
                .args(settings)
                .arg("--save-trace")
                .arg(&trace)
                .args(["-o", "/dev/null"])
                .arg(&program)
                .env("CARGO_TARGET_DIR", &target),
        );
        let dump = run_ok(
            memgaze()
                .args(["memgaze", "dump", "--header-only"])
                .arg(&trace),
        );
        let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
        dump.lines()
            .find_map(|l| l.strip_prefix("executions"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{tag}: no executions in {dump}"))
    };
    let full = executions("full", &["--full"]);
    assert!(full > 1000, "{full}");
    for (tag, settings) in [
        ("sampled", &[][..]),
        ("seed-1", &["--seed", "1"][..]),
        ("seed-max", &["--seed", "18446744073709551615"][..]),
    ] {
        assert_eq!(executions(tag, settings), full, "{tag} against --full");
    }
}

/// `run` inside a cargo project without `CARGO_TARGET_DIR` caches the
/// instrumented libraries under the relative `target/memgaze/instrumented`:
/// a copy already named as the loader needs it is used where it lies, on
/// the first run (instrumented now) and the next (found in the cache).
#[test]
fn run_in_a_project_directory_caches_libraries_under_its_relative_target() {
    let program = build("libc_strings.c", &["-O2", "-g"]);
    let project = scratch().join("libs-relative-target");
    let _ = std::fs::remove_dir_all(&project);
    std::fs::create_dir_all(project.join("target")).unwrap();
    let json = project.join("analysis.json");
    for round in ["instrumented now", "found in the cache"] {
        let out = memgaze()
            .args([
                "memgaze", "run", "-q", "--libs", LIBC, "--format", "json", "-o",
            ])
            .arg(&json)
            .arg("--")
            .arg(&program)
            .arg("4096")
            .current_dir(&project)
            .env_remove("MEMGAZE_LIBS_CACHE")
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{round}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let analysis: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let libc = analysis["summary"]["coverage_by_object"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["object"] == LIBC).cloned());
        assert_eq!(
            libc.map(|r| r["instrumented"].clone()),
            Some(serde_json::Value::Bool(true)),
            "{round}: {}",
            analysis["summary"]
        );
    }
    let cache = project.join("target/memgaze/instrumented");
    assert!(
        std::fs::read_dir(&cache).unwrap().next().is_some(),
        "{} is empty",
        cache.display()
    );
}

/// `needs_lib.c` built in `build_dlopen_fixture(name)`'s directory, linked
/// against its `libmgsum.so` (which needs `libmgdep.so`): the directory and
/// the program.
fn build_needs_lib(name: &str) -> (PathBuf, PathBuf) {
    let (dir, _) = build_dlopen_fixture(name);
    let source = memgaze_fixtures::fixtures()
        .join("rewriter")
        .join("needs_lib.c");
    let program = dir.join("needs_lib");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&program)
            .arg(&source)
            .args(["-L.", "-lmgsum", "-Wl,-rpath-link=."])
            .current_dir(&dir),
    );
    (dir, program)
}

/// A program whose library the loader cannot find fails under `run` as it
/// does natively: the loader's message and exit status 127, with the
/// default `--libs` and with `--libs all`, not an error of `cargo memgaze`
/// about listing its libraries.
#[test]
fn a_missing_library_fails_the_program_as_natively() {
    let (dir, program) = build_needs_lib("missing-library");
    // Without LD_LIBRARY_PATH the loader finds no libmgsum.so.
    let native = Command::new(&program)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert_eq!(native.status.code(), Some(127), "{native:?}");
    for libs in ["default", "all"] {
        let out = memgaze()
            .env_remove("LD_LIBRARY_PATH")
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .args(["run", "--libs", libs, "-o"])
            .arg(dir.join(format!("missing-{libs}.txt")))
            .arg("--")
            .arg(&program)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(127), "--libs {libs}: {stderr}");
        assert!(
            stderr.contains("libmgsum.so: cannot open shared object file"),
            "--libs {libs}: {stderr}"
        );
        assert!(!stderr.contains("--list"), "--libs {libs}: {stderr}");
        assert!(!stderr.contains("error:"), "--libs {libs}: {stderr}");
    }
}

/// Builds the `dlopen` fixture in its own directory: `dl_main`, which
/// `dlopen`s `libmgsum.so` by name through `LD_LIBRARY_PATH` (this
/// directory), which needs `libmgdep.so`. Returns (directory, program).
fn build_dlopen_fixture(tag: &str) -> (PathBuf, PathBuf) {
    let dir = scratch().join(format!("dlopen-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let source = |name: &str| memgaze_fixtures::fixtures().join("rewriter").join(name);
    let gcc = |args: &[&str], out: &str, src: &str, after: &[&str]| {
        run_ok(
            Command::new("gcc")
                .args(args)
                .arg("-o")
                .arg(dir.join(out))
                .arg(source(src))
                .args(after)
                .current_dir(&dir),
        );
    };
    gcc(
        &["-shared", "-fPIC", "-O2", "-g"],
        "libmgdep.so",
        "dl_dep.c",
        &[],
    );
    gcc(
        &["-shared", "-fPIC", "-O2", "-g"],
        "libmgsum.so",
        "dl_sum.c",
        &["-L.", "-lmgdep"],
    );
    gcc(&["-O2", "-g"], "dl_main", "dl_main.c", &[]);
    let program = dir.join("dl_main");
    (dir, program)
}

/// A library the executable does not need itself but one of its libraries
/// does is loaded at start: with `--libs none`, both run untraced and are
/// rows of `coverage_by_object`, and no note calls either `dlopen`ed.
#[test]
fn libraries_needed_by_libraries_are_not_called_dlopened() {
    let (dir, program) = build_needs_lib("needed-by-library");
    let target = dir.join("target");
    std::fs::create_dir_all(&target).unwrap();
    let (analysis, stdout, stderr) = run_dlopen(&program, &dir, "none", &target, &["1000"]);
    let native = run_ok(
        Command::new(&program)
            .arg("1000")
            .env("LD_LIBRARY_PATH", &dir),
    );
    assert_eq!(stdout, native.stdout, "the same output as natively");
    for library in ["libmgsum.so", "libmgdep.so"] {
        assert_eq!(
            object_row(&analysis, library)["instrumented"],
            false,
            "{library}"
        );
    }
    assert!(
        !has_note(&analysis, &["loaded after the start"]),
        "{}",
        analysis["coverage"]
    );
    assert!(!stderr.contains("loaded after the start"), "{stderr}");
    // The summary on stderr names what the executable's libraries need too.
    let untraced_line = stderr
        .lines()
        .find(|l| l.contains("not traced: loads in shared libraries"))
        .unwrap_or_else(|| panic!("no untraced-libraries line: {stderr}"));
    assert!(untraced_line.contains("libmgdep.so"), "{untraced_line}");
    // The dynamic coverage figure says it leaves them out.
    let coverage_line = stderr
        .lines()
        .find(|l| l.contains("dynamic coverage:"))
        .unwrap_or_else(|| panic!("no dynamic coverage line: {stderr}"));
    for part in [
        "of the instrumented code's load executions",
        "loads in uninstrumented libraries are not counted",
        "libmgsum.so",
        "libmgdep.so",
    ] {
        assert!(coverage_line.contains(part), "{part}: {coverage_line}");
    }
}

/// `cargo memgaze run --full --libs <libs>` of the `dlopen` fixture with
/// its own project cache under `target`: (JSON analysis, stdout, stderr).
fn run_dlopen(
    program: &Path,
    dir: &Path,
    libs: &str,
    target: &Path,
    args: &[&str],
) -> (serde_json::Value, Vec<u8>, String) {
    let json = target.join(format!("dlopen-{}.json", libs.replace('*', "all")));
    let out = run_ok(
        memgaze()
            .args(["memgaze", "run", "--full", "--libs", libs])
            .args(["--format", "json", "-o"])
            .arg(&json)
            .arg(program)
            .args(args)
            .env("LD_LIBRARY_PATH", dir)
            .env("CARGO_TARGET_DIR", target)
            .env_remove("MEMGAZE_LIBS_CACHE"),
    );
    let analysis = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (
        analysis,
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `coverage_by_object` row of `object`.
fn object_row(analysis: &serde_json::Value, object: &str) -> serde_json::Value {
    let rows = analysis["summary"]["coverage_by_object"]
        .as_array()
        .unwrap_or_else(|| panic!("no coverage_by_object: {}", analysis["summary"]));
    rows.iter()
        .find(|r| r["object"] == object)
        .unwrap_or_else(|| panic!("no row for {object}: {rows:?}"))
        .clone()
}

/// Whether one of the analysis's notes contains all of `words`.
fn has_note(analysis: &serde_json::Value, words: &[&str]) -> bool {
    analysis["coverage"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .any(|n| words.iter().all(|w| n.contains(w)))
}

/// A `dlopen`ed library and the library it needs, neither selected by
/// `--libs`: the program runs as natively, and both are rows of
/// `coverage_by_object` as not instrumented (loads unknown), named by the
/// untraced notes; the executable's own row is traced.
#[test]
fn dlopened_libraries_not_selected_are_counted_as_untraced() {
    let (dir, program) = build_dlopen_fixture("untraced");
    let native = run_ok(
        Command::new(&program)
            .args(["20000", "3"])
            .env("LD_LIBRARY_PATH", &dir),
    );
    let target = scratch().join("dlopen-untraced-target");
    std::fs::create_dir_all(&target).unwrap();
    let (analysis, stdout, stderr) =
        run_dlopen(&program, &dir, "default", &target, &["20000", "3"]);
    assert_eq!(stdout, native.stdout, "{stderr}");
    for library in ["libmgsum.so", "libmgdep.so"] {
        let row = object_row(&analysis, library);
        assert_eq!(row["instrumented"], false, "{row}");
        assert!(row["loads_executed"].is_null(), "{row}");
        assert!(row["share"].is_null(), "{row}");
        assert!(
            has_note(&analysis, &["not traced", library]),
            "{library}: {}",
            analysis["coverage"]["notes"]
        );
    }
    assert!(
        has_note(
            &analysis,
            &["after the start", "libmgsum.so", "libmgdep.so"]
        ),
        "{}",
        analysis["coverage"]["notes"]
    );
    // Not selected: nothing said about the next run.
    assert!(!has_note(&analysis, &["next run"]));
    let exe = program.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(object_row(&analysis, &exe)["instrumented"], true);
    assert_eq!(
        analysis["coverage"]["untraced_libraries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l.as_str().is_some_and(|l| l.starts_with("libmg")))
            .count(),
        2,
        "{}",
        analysis["coverage"]
    );
}

/// A selected library that the program `dlopen`s by its path: the loader
/// takes the path as it is, so once the library is remembered and
/// instrumented the run still maps the original. It is then one
/// uninstrumented row, named untraced with a note saying why, not an
/// instrumented row with nothing traced.
#[test]
fn a_library_dlopened_by_path_runs_its_original_and_is_said_untraced() {
    let (dir, program) = build_dlopen_fixture("by-path");
    let library = dir.join("libmgsum.so");
    let args = ["2000", "1", library.to_str().unwrap()];
    let native = run_ok(
        Command::new(&program)
            .args(args)
            .env("LD_LIBRARY_PATH", &dir),
    );
    let target = scratch().join("dlopen-by-path-target");
    let _ = std::fs::remove_dir_all(&target);
    std::fs::create_dir_all(&target).unwrap();
    let (first, _, stderr) = run_dlopen(&program, &dir, "libmg*", &target, &args);
    assert!(
        has_note(&first, &["libmgsum.so", "next run"]),
        "{stderr}\n{}",
        first["coverage"]["notes"]
    );
    let (second, stdout, stderr) = run_dlopen(&program, &dir, "libmg*", &target, &args);
    assert_eq!(stdout, native.stdout, "{stderr}");
    let rows: Vec<&serde_json::Value> = second["summary"]["coverage_by_object"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["object"] == "libmgsum.so")
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["instrumented"], false, "{rows:?}");
    assert!(
        has_note(
            &second,
            &["libmgsum.so", "original was loaded instead of the copy"]
        ),
        "{}",
        second["coverage"]["notes"]
    );
    assert!(
        second["coverage"]["untraced_libraries"]
            .as_array()
            .is_some_and(|l| l.iter().any(|n| n == "libmgsum.so")),
        "{}",
        second["coverage"]
    );
}

/// Reads per instruction (absolute address) in the whole run of the
/// `dlopen` fixture under Lackey; the program's stderr.
fn lackey_whole_run(program: &Path, dir: &Path, args: &[&str]) -> (HashMap<u64, u64>, Vec<u8>) {
    let mut valgrind = lackey();
    valgrind.arg(program).args(args).env("LD_LIBRARY_PATH", dir);
    lackey_reads(valgrind, "dlopen", None)
}

/// A `dlopen`ed library and the one it needs, selected by `--libs`: the
/// first run learns them (not instrumented, and says they will be from the
/// next run on), the next run offers their instrumented copies to
/// `dlopen` by name and traces them: per function, at least 99% of
/// Lackey's loads in each library are recorded and none more than Lackey
/// sees (`--full`, the whole run: the library's loads are all its own
/// calls').
#[test]
fn dlopened_libraries_selected_by_libs_are_traced_from_the_next_run_as_lackey_sees_them() {
    let (dir, program) = build_dlopen_fixture("traced");
    let args = ["50000", "4"];
    let native = run_ok(
        Command::new(&program)
            .args(args)
            .env("LD_LIBRARY_PATH", &dir),
    );
    let target = scratch().join("dlopen-traced-target");
    std::fs::create_dir_all(&target).unwrap();
    let (first, stdout, stderr) = run_dlopen(&program, &dir, "libmg*", &target, &args);
    assert_eq!(stdout, native.stdout, "{stderr}");
    assert_eq!(object_row(&first, "libmgsum.so")["instrumented"], false);
    assert!(
        has_note(&first, &["libmgsum.so", "libmgdep.so", "next run"]),
        "{}",
        first["coverage"]["notes"]
    );
    let (second, stdout, stderr) = run_dlopen(&program, &dir, "libmg*", &target, &args);
    assert_eq!(stdout, native.stdout, "{stderr}");
    for library in ["libmgsum.so", "libmgdep.so"] {
        let row = object_row(&second, library);
        assert_eq!(row["instrumented"], true, "{row}");
        assert!(row["share"].as_f64().unwrap() > 0.99, "{row}");
    }
    assert!(
        !has_note(&second, &["after the start"]),
        "{}",
        second["coverage"]["notes"]
    );

    let cache = target.join("memgaze").join("instrumented");
    let objects = [
        (
            "mgsum",
            "libmgsum.so",
            cached_annotation(&cache, "libmgsum.so"),
        ),
        (
            "mgdep",
            "libmgdep.so",
            cached_annotation(&cache, "libmgdep.so"),
        ),
    ];
    let mut recorded: HashMap<(String, u64), u64> = HashMap::new();
    for load in second["loads"].as_array().unwrap() {
        let ip =
            u64::from_str_radix(load["ip"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        let object = load["object"]
            .as_str()
            .expect("every load names its object");
        *recorded.entry((object.to_string(), ip)).or_default() += load["count"].as_u64().unwrap();
    }
    let size = |a: &Annotation| a.functions.iter().map(|f| f.start + f.size).max().unwrap();
    let (lackey, stderr) = lackey_whole_run(&program, &dir, &args);
    let placed = bases(&stderr);
    let ranges: Vec<(u64, u64)> = objects
        .iter()
        .map(|(tag, _, a)| (placed[*tag], placed[*tag] + size(a)))
        .collect();
    let mut per_function: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for ((_, object, annotation), &(lo, hi)) in objects.iter().zip(&ranges) {
        let explicit: HashSet<u64> = annotation.loads.iter().map(|l| l.ip).collect();
        for (&ip, &n) in lackey.iter().filter(|(ip, _)| lo <= **ip && **ip < hi) {
            let offset = ip - lo;
            let ours = if explicit.contains(&offset) {
                recorded
                    .get(&(object.to_string(), offset))
                    .copied()
                    .unwrap_or(0)
            } else {
                0
            };
            let row = per_function
                .entry((object.to_string(), function_at(annotation, offset)))
                .or_default();
            row.0 += n;
            row.1 += ours;
        }
    }
    for ((object, function), (l, o)) in &per_function {
        eprintln!("{object:>12} {function:<24} Lackey {l:>9}  ours {o:>9}");
    }
    for object in ["libmgsum.so", "libmgdep.so"] {
        let rows: Vec<_> = per_function
            .iter()
            .filter(|((o, _), _)| o == object)
            .collect();
        let lackey_total: u64 = rows.iter().map(|(_, r)| r.0).sum();
        let ours_total: u64 = rows.iter().map(|(_, r)| r.1.min(r.0)).sum();
        assert!(lackey_total >= 100_000, "{object}: {lackey_total}");
        assert!(
            ours_total as f64 >= 0.99 * lackey_total as f64,
            "{object}: {ours_total} of Lackey's {lackey_total} loads recorded"
        );
        for ((_, function), (l, o)) in rows {
            assert!(o <= l, "{object} {function}: {o} recorded, Lackey saw {l}");
        }
    }
}

/// `instrument --library N` writes the annotation in the format
/// `--annotation-format` asks for (JSON here, compact by default), and
/// refuses `--functions`, which a library (instrumented whole) cannot take.
#[test]
fn instrument_library_takes_the_annotation_format_and_refuses_functions() {
    let library = Path::new("/lib/x86_64-linux-gnu/libgcc_s.so.1");
    let dir = scratch().join("library-formats");
    std::fs::create_dir_all(&dir).unwrap();
    let annotation_start = |format: Option<&str>, name: &str| -> u8 {
        let output = dir.join(name);
        let mut command = memgaze();
        command.args(["instrument", "-q", "--library", "3"]);
        if let Some(format) = format {
            command.args(["--annotation-format", format]);
        }
        run_ok(command.arg(library).arg("-o").arg(&output));
        let mut annotation = output.into_os_string();
        annotation.push(".memgaze.json");
        std::fs::read(&annotation).unwrap()[0]
    };
    assert_eq!(annotation_start(Some("json"), "json.so"), b'{');
    assert_ne!(annotation_start(None, "compact.so"), b'{');
    let out = memgaze()
        .args(["instrument", "--library", "3", "--functions", "x*"])
        .arg(library)
        .arg("-o")
        .arg(dir.join("refused.so"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!dir.join("refused.so").exists());
}

/// A `--libs` pattern that matches none of the libraries the program loads
/// (`libc` for `libc.so.6`: patterns match the whole name) used to select
/// nothing silently; now one note names it with the libraries there are.
/// `default`'s names are not held to it: most programs need no libgcc_s.
#[test]
fn a_libs_pattern_that_matches_no_library_is_named() {
    let run = |libs: &str| {
        let out = memgaze()
            .args([
                "run",
                "--libs",
                libs,
                "-o",
                "/dev/null",
                "--",
                "/usr/bin/true",
            ])
            .env("NO_COLOR", "1")
            .current_dir(scratch())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        err
    };
    let err = run("default,libc,libnosuch*");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("matches none")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0]
            .starts_with("memgaze: note: --libs libc, libnosuch* matches none of the libraries")
            && notes[0].contains("libc.so.6")
            && notes[0].contains("(`libc*`)"),
        "{err}"
    );
    let err = run("default");
    assert!(!err.contains("matches none"), "{err}");
}

/// glibc's `catomic_*` operations jump over their `lock` prefix when the
/// process is single-threaded (`je 1f; lock; 1: cmpxchg`), in `malloc`'s
/// `_int_malloc` and `_int_free` among others: such a function is copied
/// (the branch enters the locked instruction) rather than left out with
/// "branch into the middle of an instruction", so the loads of `malloc`
/// and `free` are traced.
#[test]
fn libc_functions_that_jump_over_a_lock_prefix_are_instrumented() {
    let library = Path::new("/lib/x86_64-linux-gnu").join(LIBC);
    let output = scratch().join("lock-skips-libc.so.6");
    run_ok(
        memgaze()
            .args([
                "instrument",
                "-q",
                "--library",
                "1",
                "--annotation-format",
                "json",
            ])
            .arg(&library)
            .arg("-o")
            .arg(&output),
    );
    let mut annotation = output.into_os_string();
    annotation.push(".memgaze.json");
    let annotation: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&annotation).unwrap()).unwrap();
    let functions = annotation["functions"].as_array().unwrap();
    assert!(functions.len() > 1000, "{} functions", functions.len());
    let into_the_middle: Vec<&str> = functions
        .iter()
        .filter(|f| {
            f["skipped"]
                .as_str()
                .is_some_and(|why| why.contains("into the middle of an instruction"))
        })
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(into_the_middle.is_empty(), "{into_the_middle:?}");
}

/// `run` of a program whose loads are mostly libc's `malloc` and `free`,
/// with libc instrumented. Libraries take no spatial samples: in a sampled
/// run a libc load's tracked accesses are only those its time windows
/// recorded, so libc's miss ratios are unknown (null) and the whole-run
/// figures leave it out, with a note that counts it; the executable's
/// functions keep theirs. A full run (`--full`) has every record: libc's
/// miss ratios are there, and libc's misses are in the total.
#[test]
fn sampled_runs_leave_libraries_out_of_the_cache_figures() {
    let program = build("malloc_pool.c", &["-O2", "-g"]);
    let target = scratch().join("libs-unsampled-target");
    std::fs::create_dir_all(&target).unwrap();
    let analyse = |mode: &[&str], tag: &str| -> serde_json::Value {
        let json = scratch().join(format!("libs-unsampled-{tag}.json"));
        run_ok(
            memgaze()
                .args(["memgaze", "run", "-q", "--libs", LIBC])
                .args(mode)
                .args(["--format", "json", "-o"])
                .arg(&json)
                .arg(&program)
                .arg("100000")
                .env("CARGO_TARGET_DIR", &target),
        );
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
    };
    let functions = |analysis: &serde_json::Value, libc: bool| -> Vec<serde_json::Value> {
        analysis["functions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| (f["object"] == LIBC) == libc)
            .cloned()
            .collect()
    };
    let misses = |analysis: &serde_json::Value| analysis["summary"]["misses_L1"].as_f64().unwrap();

    let full = analyse(&["--full"], "full");
    let full_libc = functions(&full, true);
    assert!(
        full_libc.iter().any(|f| f["MR_L1"].as_f64().is_some()),
        "a full run has libc's miss ratios: {full_libc:?}"
    );
    assert!(
        !has_note(&full, &["no spatial samples"]),
        "{}",
        full["coverage"]["notes"]
    );

    let sampled = analyse(&[], "sampled");
    let sampled_libc = functions(&sampled, true);
    assert!(!sampled_libc.is_empty(), "libc ran traced loads");
    for f in &sampled_libc {
        assert!(
            f["MR_L1"].is_null() && f["MR_LLC"].is_null(),
            "libc's miss ratios are unknown in a sampled run: {f}"
        );
        assert!(f["mrc"].is_null(), "no curve: {f}");
    }
    let main = functions(&sampled, false)
        .into_iter()
        .find(|f| f["name"] == "main")
        .unwrap_or_else(|| panic!("no main: {}", sampled["functions"]));
    assert!(main["MR_L1"].as_f64().is_some(), "{main}");
    assert!(
        has_note(
            &sampled,
            &["leave out", "of libc.so.6", "no spatial samples"]
        ),
        "{}",
        sampled["coverage"]["notes"]
    );
    // The total is the executable's misses alone: below the full run's,
    // which has libc's too (most of them here).
    assert!(
        misses(&sampled) < misses(&full),
        "{} {}",
        misses(&sampled),
        misses(&full)
    );
}
