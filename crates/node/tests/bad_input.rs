//! Bad input campaign (proptest): the config parser, the prolog's environment, SPANK option
//! values through tenant resolution, the audit log's verify and report parsers. Nothing may
//! panic; errors must locate or name what is wrong; a bad job environment must make nothing and
//! leave a job_denied record. Each property counts its inputs and prints count and time.
//!
//! `TENANCY_FUZZ_SCALE=N` multiplies every campaign's input count (default: the counts below).

use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestRunner};
use serde_json::json;
use std::cell::RefCell;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;
use tenancy_accounting::verify_paths;
use tenancy_audit_log::{AnchorSet, AuditLog, Event, Outcome, Record};
use tenancy_config::{Config, ConfigError, Identity};
use tenancy_job::{JobContext, Journal};
use tenancy_node::{JobPlan, Layer, LayerResult, Spine};
use tenancy_test_support::{fuzz_cases, ScratchOnExit, TenancyToml};

/// Runs `test` over `cases` inputs of `strategy`, fails with the shrunk input, reports figures.
fn campaign<S: Strategy>(name: &str, n: u32, strategy: S, test: impl Fn(S::Value)) {
    let t0 = Instant::now();
    let count = std::cell::Cell::new(0u64);
    let mut runner = TestRunner::new(PtConfig {
        cases: n,
        failure_persistence: None,
        ..PtConfig::default()
    });
    let r = runner.run(&strategy, |v| {
        count.set(count.get() + 1);
        test(v);
        Ok(())
    });
    eprintln!(
        "FIGURES {name}: {} inputs in {:.2?}",
        count.get(),
        t0.elapsed()
    );
    if let Err(e) = r {
        panic!("{name}: {e}");
    }
}

// ---- config ------------------------------------------------------------------------------

/// A config that uses every section, as the mutations' seed.
fn sample() -> String {
    let mut c = TenancyToml::new("demo");
    c.cluster()
        .state_dir("/var/lib/tenancy")
        .audit_log("/var/log/tenancy/audit.jsonl")
        .scratch_root("/scratch")
        .nvml_library("/usr/lib/libnvidia-ml.so.1");
    c.node()
        .proc_devices("/proc/devices")
        .mig_minors("/proc/driver/nvidia-caps/mig-minors");
    c.network()
        .infrastructure(["10.0.0.0/8:6817-6819/tcp", "10.1.2.3/32"]);
    c.mig_plan("H200-141GB")
        .instances("1g.18gb", 4)
        .instances("3g.71gb", 1);
    c.tier("internal")
        .mig_profiles(["1g.18gb", "3g.71gb"])
        .share_gpu(true)
        .share_node(true)
        .scratch_on_exit(ScratchOnExit::Retain)
        .retain_days(7)
        .scratch_mode("0750")
        .device_classes(["c 1:3 rwm"]);
    c.tier("restricted")
        .mig_profiles(["1g.18gb"])
        .share_gpu(false)
        .share_node(false);
    c.tenant("acme")
        .tier("internal")
        .groups(["acme", "root"])
        .accounts(["acme-a"])
        .egress(["192.168.0.0/16:443/tcp"]);
    c.tenant("lab-2").tier("restricted").groups(["lab2"]);
    c.to_string()
}

fn check_config(text: &str) {
    match Config::parse(text, Path::new("/etc/slurm/tenancy.toml")) {
        Ok(_) => {}
        Err(e) => {
            let shown = e.to_string();
            let problems = e.problems();
            assert!(
                matches!(e, ConfigError::Invalid(_)) && !problems.is_empty(),
                "unlocated error: {shown}"
            );
            let lines = text.split('\n').count();
            for p in problems {
                assert!(
                    p.line >= 1 && p.line <= lines && p.column >= 1,
                    "bad location {}:{} for {lines} lines: {shown}",
                    p.line,
                    p.column
                );
                assert!(
                    shown.contains(&format!("tenancy.toml:{}:{}: ", p.line, p.column)),
                    "{shown}"
                );
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, String),
    DupLine(usize),
    SwapLines(usize, usize),
    Replace(usize, char),
}

/// What an edit may insert into a config: TOML's punctuation, sections, odd values.
static CONFIG_JUNK: [&str; 13] = [
    "\"",
    "[",
    "]",
    "=",
    "\n",
    "[tiers.x]\n",
    "[tenants.acme]\n",
    "tier = \"nope\"\n",
    "\u{feff}",
    "é",
    "-1",
    "99999999999999999999",
    "../../etc",
];

fn edit_strategy() -> impl Strategy<Value = Edit> {
    let junk = prop_oneof![
        13 => proptest::sample::select(&CONFIG_JUNK[..]).prop_map(String::from),
        1 => ".{0,12}",
    ];
    prop_oneof![
        (any::<usize>(), 0usize..40).prop_map(|(a, n)| Edit::Delete(a, n)),
        (any::<usize>(), junk).prop_map(|(a, s)| Edit::Insert(a, s)),
        any::<usize>().prop_map(Edit::DupLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        (any::<usize>(), any::<char>()).prop_map(|(a, c)| Edit::Replace(a, c)),
    ]
}

/// Duplicates line `i` (modulo their number) of `lines`, or with `swap` swaps it with that one.
fn dup_or_swap<T: Clone>(lines: &mut Vec<T>, i: usize, swap: Option<usize>) {
    let i = i % lines.len();
    match swap {
        None => {
            let l = lines[i].clone();
            lines.insert(i, l);
        }
        Some(j) => {
            let j = j % lines.len();
            lines.swap(i, j);
        }
    }
}

fn apply_edits(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        let len = chars.len().max(1);
        match e {
            Edit::Delete(a, n) => {
                let a = a % len;
                let b = (a + n).min(chars.len());
                if a < b {
                    chars.drain(a..b);
                }
            }
            Edit::Insert(a, s) => {
                let a = a % (chars.len() + 1);
                chars.splice(a..a, s.chars());
            }
            Edit::Replace(a, c) => {
                if !chars.is_empty() {
                    let a = a % chars.len();
                    chars[a] = *c;
                }
            }
            Edit::DupLine(i) | Edit::SwapLines(i, _) => {
                let s: String = chars.iter().collect();
                let mut lines: Vec<String> = s.split('\n').map(String::from).collect();
                let swap = match e {
                    Edit::SwapLines(_, j) => Some(*j),
                    _ => None,
                };
                dup_or_swap(&mut lines, *i, swap);
                chars = lines.join("\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

#[test]
fn config_parser_survives_arbitrary_and_mutated_text_and_locates_errors() {
    let sample = sample();
    check_config(&sample);
    assert!(Config::parse(&sample, Path::new("t.toml")).is_ok());
    campaign(
        "config/arbitrary",
        fuzz_cases(1500),
        ".{0,300}",
        |t: String| check_config(&t),
    );
    campaign(
        "config/arbitrary-bytes-lossy",
        fuzz_cases(500),
        proptest::collection::vec(any::<u8>(), 0..300),
        |b: Vec<u8>| check_config(&String::from_utf8_lossy(&b)),
    );
    campaign(
        "config/mutated-sample",
        fuzz_cases(2500),
        proptest::collection::vec(edit_strategy(), 1..6),
        |edits: Vec<Edit>| check_config(&apply_edits(&sample, &edits)),
    );
}

// ---- job environment ---------------------------------------------------------------------

const VARS: &[&str] = &[
    "SLURM_JOB_ID",
    "SLURM_JOB_UID",
    "SLURM_JOB_GID",
    "SLURM_JOB_USER",
    "SLURMD_NODENAME",
    "SLURM_CLUSTER_NAME",
    "SLURM_JOB_ACCOUNT",
    "SLURM_JOB_PARTITION",
    "SPANK_TENANCY_TENANT",
    "SPANK_TENANCY_MIG",
    "SLURM_JOB_GPUS",
];

fn good_env(job: u64) -> Vec<(OsString, OsString)> {
    [
        ("SLURM_JOB_ID", job.to_string()),
        ("SLURM_JOB_UID", "0".into()),
        ("SLURM_JOB_GID", "0".into()),
        ("SLURM_JOB_USER", "root".into()),
        ("SLURMD_NODENAME", "node1".into()),
        ("SPANK_TENANCY_TENANT", "acme".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect()
}

/// The hostile values a fuzz case may take as they are (traversal, shell, NUL, numbers).
static HOSTILE_VALUES: [&str; 13] = [
    "../../../etc/passwd",
    "acme; rm -rf / #",
    "$(reboot)",
    "`id`",
    "acme\0root",
    "18446744073709551616",
    "-1",
    "0",
    " 42",
    "４２",
    "acme\n",
    "ACME",
    "1g.18gb/../../x",
];

/// A hostile value: bytes (non-UTF-8 included), huge, control characters, traversal, shell.
fn hostile_value() -> impl Strategy<Value = OsString> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(OsString::from_vec),
        1 => ".{0,40}".prop_map(OsString::from),
        1 => (1usize..20_000).prop_map(|n| OsString::from("9".repeat(n))),
        1 => (1usize..20_000).prop_map(|n| OsString::from("a".repeat(n))),
        13 => proptest::sample::select(&HOSTILE_VALUES[..]).prop_map(OsString::from),
    ]
}

/// Zero or more variables replaced (or removed) with hostile values.
fn hostile_env() -> impl Strategy<Value = Vec<(OsString, OsString)>> {
    hostile_env_of(VARS)
}

fn hostile_env_of(
    vars: &'static [&'static str],
) -> impl Strategy<Value = Vec<(OsString, OsString)>> {
    proptest::collection::vec(
        (
            0..vars.len(),
            proptest::option::weighted(0.9, hostile_value()),
        ),
        1..5,
    )
    .prop_map(move |changes| {
        let mut env = good_env(77);
        for (i, v) in changes {
            env.retain(|(k, _)| k != vars[i]);
            if let Some(v) = v {
                env.push((vars[i].into(), v));
            }
        }
        env
    })
}

/// Every variable but the node name: a hostile but well-formed SLURMD_NODENAME names another
/// node, and its denial lands in that node's chain (slurmd always sets the variable itself).
fn vars_but_node() -> &'static [&'static str] {
    let vars: Vec<&str> = VARS
        .iter()
        .copied()
        .filter(|v| *v != "SLURMD_NODENAME")
        .collect();
    vars.leak()
}

#[test]
fn job_environment_parser_survives_garbage_and_names_the_variable() {
    campaign(
        "env/from_vars",
        fuzz_cases(4000),
        hostile_env(),
        |env: Vec<(OsString, OsString)>| match JobContext::from_vars(env.clone()) {
            Ok(c) => {
                assert!(c.job_id > 0);
                assert!(c.user.len() <= 128 && !c.user.contains('/'));
                for v in [&c.requested_tenant, &c.requested_profile]
                    .into_iter()
                    .flatten()
                {
                    assert!(v.len() <= 4096 && !v.chars().any(char::is_control));
                }
            }
            Err(e) => {
                assert!(VARS.contains(&e.variable), "{e:?}");
                let shown = e.to_string();
                assert!(shown.starts_with(e.variable), "{shown}");
                assert!(shown.len() < 10_000, "error echoes a huge value");
            }
        },
    );
    // Completely arbitrary variable sets (names too).
    campaign(
        "env/arbitrary-sets",
        fuzz_cases(1000),
        proptest::collection::vec((hostile_value(), hostile_value()), 0..12),
        |env: Vec<(OsString, OsString)>| {
            let _ = JobContext::from_vars(env);
        },
    );
}

/// A layer that records whether the spine called it at all.
struct Tripwire(Rc<RefCell<u32>>);

impl Layer for Tripwire {
    fn name(&self) -> &'static str {
        "tripwire"
    }
    fn intend(&mut self, _: &JobPlan) -> LayerResult<Option<serde_json::Value>> {
        *self.0.borrow_mut() += 1;
        Ok(Some(json!({})))
    }
    fn make(&mut self, _: &serde_json::Value, _: &Journal) -> LayerResult<serde_json::Value> {
        *self.0.borrow_mut() += 1;
        Ok(json!({}))
    }
    fn undo(&mut self, _: &serde_json::Value, _: Option<&serde_json::Value>) -> LayerResult<()> {
        Ok(())
    }
}

fn test_config(root: &Path) -> Config {
    let mut text = TenancyToml::minimal("test", root);
    text.tier("internal").mig_profiles(["1g.18gb"]);
    Config::parse(&text.to_string(), &root.join("tenancy.toml")).unwrap()
}

fn audit_lines(path: &Path) -> Vec<Record> {
    tenancy_test_support::json_lines(path)
}

/// Runs the prolog (a tripwire layer stands for the layers) over hostile environments: a bad one
/// makes nothing, leaves no journal and appends exactly one job_denied record.
fn hostile_prologs(
    name: &str,
    n: u32,
    vars: &'static [&'static str],
) -> (tempfile::TempDir, Config) {
    let tmp = tempfile::tempdir().unwrap();
    let config = test_config(tmp.path());
    let calls = Rc::new(RefCell::new(0u32));
    let denied = std::cell::Cell::new(0u64);
    campaign(
        name,
        n,
        hostile_env_of(vars),
        |env: Vec<(OsString, OsString)>| {
            let ctx = JobContext::from_vars(env);
            let parsed_ok = ctx.is_ok();
            let before = audit_lines(&config.cluster.audit_log).len();
            *calls.borrow_mut() = 0;
            let layers: Vec<Box<dyn Layer>> = vec![Box::new(Tripwire(calls.clone()))];
            let mut spine = Spine::new(&config, layers, "tenancy-prolog").unwrap();
            let end = spine.prolog(ctx.clone());
            let recs = audit_lines(&config.cluster.audit_log);
            assert_eq!(recs.len(), before + 1, "exactly one record per prolog");
            let last = recs.last().unwrap();
            if end.code == 0 {
                // Only a job that is really root in tenant acme may run.
                let c = ctx.unwrap();
                assert_eq!((c.uid, c.user.as_str()), (0, "root"));
                assert_eq!(last.event, Event::JobStart);
                let end = spine.epilog(&c);
                assert_eq!(end.code, 0, "{}", end.message);
            } else {
                denied.set(denied.get() + 1);
                assert_eq!(*calls.borrow(), 0, "a layer was called: {}", end.message);
                assert_eq!(last.event, Event::JobDenied, "{}", end.message);
                assert_eq!(last.outcome, Outcome::Denied);
                assert!(end.message.len() < 10_000);
                if !parsed_ok {
                    assert!(last
                        .reason
                        .as_deref()
                        .unwrap()
                        .contains("bad job environment"));
                }
                let state = config.cluster.state_dir.read_dir().unwrap();
                let journals = state
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("job_"))
                    .count();
                assert_eq!(journals, 0, "a denied job left a journal");
            }
        },
    );
    eprintln!("FIGURES {name}: {} denied", denied.get());
    (tmp, config)
}

/// `audit verify` of the config's audit log (no anchors, 5 seconds) finds nothing.
fn assert_chain_clean(config: &Config) {
    let log = std::slice::from_ref(&config.cluster.audit_log);
    let report = verify_paths(log, &AnchorSet::default(), 5).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn a_prolog_with_a_hostile_environment_makes_nothing_and_records_a_denial() {
    hostile_prologs("prolog/hostile-env", fuzz_cases(200), VARS);
}

#[test]
fn denials_of_hostile_environments_keep_the_audit_chain_valid() {
    let (_tmp, config) =
        hostile_prologs("prolog/hostile-env-chain", fuzz_cases(150), vars_but_node());
    assert_chain_clean(&config);
}

/// A denial whose SLURMD_NODENAME is missing goes into this node's chain under the host's short
/// name (as slurmd names the node by default), so `audit verify` sees one node and no gap.
#[test]
fn a_denial_without_a_node_name_keeps_the_audit_chain_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let config = test_config(tmp.path());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim().split('.').next().unwrap().to_string();
    let prolog = |env: Vec<(OsString, OsString)>| {
        let layers: Vec<Box<dyn Layer>> = vec![Box::new(Tripwire(Rc::default()))];
        let mut spine = Spine::new(&config, layers, "tenancy-prolog").unwrap();
        spine.prolog(JobContext::from_vars(env))
    };
    let mut env = good_env(5);
    env.retain(|(k, _)| k != "SLURMD_NODENAME");
    env.push(("SLURMD_NODENAME".into(), host.clone().into()));
    env.push(("SPANK_TENANCY_MIG".into(), "bogus".into()));
    assert_eq!(prolog(env).code, 1);
    let mut env = good_env(6);
    env.retain(|(k, _)| k != "SLURMD_NODENAME");
    assert_eq!(prolog(env).code, 1);
    let recs = audit_lines(&config.cluster.audit_log);
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|r| r.node == host), "{recs:?}");
    assert_chain_clean(&config);
}

// ---- SPANK option values -----------------------------------------------------------------

/// Option values that are nearly a configured tenant or profile.
static NEAR_MISSES: [&str; 12] = [
    "../acme",
    "acme/..",
    "acme\0",
    "acme ",
    "Acme",
    "acme;id",
    "$(id)",
    "1g.18gb ",
    "1G.18GB",
    "7g.141gb",
    "1g.18gb+me",
    "１g.18gb",
];

#[test]
fn spank_option_values_never_resolve_to_anything_but_a_configured_tenant_and_profile() {
    let tmp = tempfile::tempdir().unwrap();
    let config = test_config(tmp.path());
    let root = Identity::with_groups(0, "root", vec![0]);
    let value = prop_oneof![
        1 => ".{0,64}",
        1 => "[a-z0-9._/-]{0,40}",
        1 => (1usize..12_000).prop_map(|n| "a".repeat(n)),
        1 => (1usize..3000).prop_map(|n| "é".repeat(n)),
        12 => proptest::sample::select(&NEAR_MISSES[..]).prop_map(String::from),
    ];
    campaign(
        "spank/resolve",
        fuzz_cases(5000),
        (
            proptest::option::of(value.clone()),
            proptest::option::of(value),
        ),
        |(tenant, profile): (Option<String>, Option<String>)| {
            let r = config.resolve(&root, None, tenant.as_deref(), profile.as_deref());
            match r {
                Ok(res) => {
                    assert_eq!(res.tenant, "acme");
                    assert!(tenant.is_none() || tenant.as_deref() == Some("acme"));
                    match profile.as_deref().filter(|p| !p.is_empty()) {
                        None => assert_eq!(res.profile, None),
                        Some(p) => {
                            assert_eq!(p, "1g.18gb");
                            assert_eq!(res.profile.as_deref(), Some("1g.18gb"));
                        }
                    }
                }
                Err(refusal) => {
                    let shown = refusal.to_string();
                    assert!(!shown.is_empty() && !shown.contains('\n'), "{shown:?}");
                }
            }
        },
    );
}

// ---- audit log parsers -------------------------------------------------------------------

fn sample_log(dir: &Path) -> Vec<u8> {
    let path = dir.join("seed.jsonl");
    let mut log = AuditLog::open(&path).unwrap().with_fsync(false);
    for (i, ev) in [
        Event::JobStart,
        Event::JobEnd,
        Event::JobDenied,
        Event::JobStart,
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = Record::new("c", "node1", "alice", 1001, ev, Outcome::Success, "test")
            .job_id(10 + i as u64)
            .tenant("acme")
            .tier("internal")
            .profile("1g.18gb")
            .compute_slices(1);
        log.append(&mut r).unwrap();
    }
    std::fs::read(&path).unwrap()
}

#[derive(Debug, Clone)]
enum LogEdit {
    Flip(usize, u8),
    Truncate(usize),
    DropLine(usize),
    DupLine(usize),
    SwapLines(usize, usize),
    Insert(usize, Vec<u8>),
}

fn log_edit() -> impl Strategy<Value = LogEdit> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(a, x)| LogEdit::Flip(a, x)),
        any::<usize>().prop_map(LogEdit::Truncate),
        any::<usize>().prop_map(LogEdit::DropLine),
        any::<usize>().prop_map(LogEdit::DupLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| LogEdit::SwapLines(a, b)),
        (
            any::<usize>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 1..60),
                Just(b"\n".to_vec()),
                Just(b"{}\n".to_vec()),
                Just(b"{\"seq\":1}\n".to_vec()),
                Just(b"\xff\xfe\n".to_vec()),
            ]
        )
            .prop_map(|(a, b)| LogEdit::Insert(a, b)),
    ]
}

fn apply_log_edit(bytes: &mut Vec<u8>, e: &LogEdit) {
    let split = |b: &Vec<u8>| -> Vec<Vec<u8>> {
        b.split_inclusive(|&c| c == b'\n')
            .map(<[u8]>::to_vec)
            .collect()
    };
    match e {
        LogEdit::Flip(a, x) => {
            if !bytes.is_empty() {
                let a = a % bytes.len();
                bytes[a] ^= x;
            }
        }
        LogEdit::Truncate(a) => {
            let a = a % (bytes.len() + 1);
            bytes.truncate(a);
        }
        LogEdit::Insert(a, b) => {
            let a = a % (bytes.len() + 1);
            bytes.splice(a..a, b.iter().copied());
        }
        LogEdit::DropLine(i) | LogEdit::DupLine(i) | LogEdit::SwapLines(i, _) => {
            let mut lines = split(bytes);
            if lines.is_empty() {
                return;
            }
            match e {
                LogEdit::DropLine(_) => {
                    lines.remove(i % lines.len());
                }
                LogEdit::SwapLines(_, j) => dup_or_swap(&mut lines, *i, Some(*j)),
                _ => dup_or_swap(&mut lines, *i, None),
            }
            *bytes = lines.concat();
        }
    }
}

#[test]
fn audit_verify_and_report_survive_random_and_tampered_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = sample_log(tmp.path());
    let path: PathBuf = tmp.path().join("node1.jsonl");
    std::fs::write(&path, &seed).unwrap();
    assert!(
        verify_paths(std::slice::from_ref(&path), &AnchorSet::default(), 5)
            .unwrap()
            .is_clean()
    );
    let undetected = RefCell::new(Vec::<String>::new());
    let feed_report = |bytes: &[u8]| {
        let mut agg = tenancy_accounting::report::Aggregator::new(Default::default());
        for line in bytes.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            agg.feed(line);
        }
        let _ = agg.finish();
    };
    campaign(
        "audit/tampered",
        fuzz_cases(1500),
        proptest::collection::vec(log_edit(), 1..4),
        |edits: Vec<LogEdit>| {
            let mut bytes = seed.clone();
            for e in &edits {
                apply_log_edit(&mut bytes, e);
            }
            std::fs::write(&path, &bytes).unwrap();
            let r = verify_paths(std::slice::from_ref(&path), &AnchorSet::default(), 5);
            feed_report(&bytes);
            // Anything but the original bytes, or a clean cut at a line end (which only an
            // anchor can reveal), must be reported. Exact copies of a record after it are not
            // tampering (at-least-once forwarding leaves them in a collector's file: verify
            // skips them, in a note): the log without them is what counts.
            let mut seen = std::collections::HashSet::new();
            let firsts: Vec<u8> = bytes
                .split_inclusive(|&c| c == b'\n')
                .filter(|l| !l.ends_with(b"\n") || seen.insert(l.to_vec()))
                .flatten()
                .copied()
                .collect();
            let clean_cut =
                seed.starts_with(&firsts) && (firsts.is_empty() || firsts.ends_with(b"\n"));
            if firsts != seed && !clean_cut {
                match r {
                    Ok(rep) if rep.is_clean() => undetected
                        .borrow_mut()
                        .push(format!("{edits:?}: {}", String::from_utf8_lossy(&bytes))),
                    _ => {}
                }
            }
        },
    );
    campaign(
        "audit/random-lines",
        fuzz_cases(800),
        proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..120),
                ".{0,120}".prop_map(String::into_bytes),
                Just(b"{\"seq\":18446744073709551615,\"prev\":\"x\",\"hash\":\"y\"}".to_vec()),
                Just(b"{\"seq\":-1}".to_vec()),
                Just(b"[]".to_vec()),
                Just(b"null".to_vec()),
            ],
            0..8,
        ),
        |lines: Vec<Vec<u8>>| {
            let bytes = lines.join(&b'\n');
            std::fs::write(&path, &bytes).unwrap();
            let _ = verify_paths(std::slice::from_ref(&path), &AnchorSet::default(), 5);
            feed_report(&bytes);
        },
    );
    let undetected = undetected.into_inner();
    assert!(
        undetected.is_empty(),
        "{} tampered logs verified clean, e.g. {}",
        undetected.len(),
        undetected[0]
    );
}
