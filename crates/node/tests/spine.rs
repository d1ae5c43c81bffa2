//! The spine with test layers that make real files: order, journal, rollback, teardown, audit.

use serde_json::{json, Value};
use std::cell::RefCell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use tenancy_accounting::verify_paths;
use tenancy_audit_log::{AnchorSet, Event, Record};
use tenancy_config::Config;
use tenancy_job::{JobContext, Journal, StepState};
use tenancy_node::{JobPlan, Layer, LayerResult, Spine};
use tenancy_test_support::TenancyToml;

/// A layer that makes one file per job and logs every call.
struct FileLayer {
    name: &'static str,
    dir: PathBuf,
    fail_make: bool,
    /// What it makes would not outlive a restart of the node.
    volatile: bool,
    calls: Rc<RefCell<Vec<String>>>,
}

impl Layer for FileLayer {
    fn name(&self) -> &'static str {
        self.name
    }
    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Value>> {
        self.calls
            .borrow_mut()
            .push(format!("intend {}", self.name));
        let path = self.dir.join(format!("{}-{}", self.name, plan.job_id));
        Ok(Some(json!({ "path": path })))
    }
    fn make(&mut self, intent: &Value, _: &Journal) -> LayerResult<Value> {
        self.calls.borrow_mut().push(format!("make {}", self.name));
        let path = intent["path"].as_str().unwrap();
        std::fs::write(path, b"x")?;
        if self.fail_make {
            return Err(tenancy_node::LayerError(format!(
                "{path}: injected failure"
            )));
        }
        Ok(json!({ "path": path, "made": true }))
    }
    fn undo(&mut self, intent: &Value, made: Option<&Value>) -> LayerResult<()> {
        self.calls
            .borrow_mut()
            .push(format!("undo {} made={}", self.name, made.is_some()));
        match std::fs::remove_file(intent["path"].as_str().unwrap()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
    fn survives_restart(&self) -> bool {
        !self.volatile
    }
}

/// A layer whose `make` looks at the job's journal on disk and at what the layer before it made.
struct Witness {
    name: &'static str,
    before: &'static str,
    state_dir: PathBuf,
    seen: Rc<RefCell<Vec<String>>>,
}

impl Layer for Witness {
    fn name(&self) -> &'static str {
        self.name
    }
    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Value>> {
        Ok(Some(json!({ "job": plan.job_id })))
    }
    fn make(&mut self, intent: &Value, journal: &Journal) -> LayerResult<Value> {
        let file = self.state_dir.join(format!("job_{}.json", intent["job"]));
        let on_disk: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
        let layers: Vec<&str> = on_disk["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["layer"].as_str().unwrap())
            .collect();
        self.seen.borrow_mut().push(format!(
            "{} sees intents {layers:?} on disk, {} made: {}",
            self.name,
            self.before,
            journal.made_by(self.before).is_some()
        ));
        Ok(json!({ "made": self.name }))
    }
    fn undo(&mut self, _: &Value, _: Option<&Value>) -> LayerResult<()> {
        Ok(())
    }
}

struct World {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    config: Config,
    calls: Rc<RefCell<Vec<String>>>,
}

impl World {
    fn new() -> World {
        World::with_cluster(|_, _| {})
    }

    /// `cluster` sets more `[cluster]` keys, given the world's folder.
    fn with_cluster(cluster: impl FnOnce(&mut TenancyToml, &Path)) -> World {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let mut text = TenancyToml::minimal("test", &root);
        text.tier("internal").mig_profiles(["1g.18gb"]);
        cluster(&mut text, &root);
        let config = Config::parse(&text.to_string(), &root.join("tenancy.toml")).unwrap();
        std::fs::create_dir(root.join("made")).unwrap();
        World {
            _tmp: tmp,
            root,
            config,
            calls: Rc::default(),
        }
    }

    fn spine(&self, fail: Option<&'static str>, origin: &'static str) -> Spine<'_> {
        spine_of(&self.config, &self.root, &self.calls, fail, origin)
    }

    fn made_files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.root.join("made"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn records(&self) -> Vec<Record> {
        let Ok(text) = std::fs::read_to_string(self.root.join("audit.jsonl")) else {
            return vec![];
        };
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn chain_is_valid(&self) -> bool {
        verify_paths(&[self.root.join("audit.jsonl")], &AnchorSet::default(), 10)
            .unwrap()
            .is_clean()
    }
}

/// The spine of a [`World`] with three file layers, from its parts (for a spine made where the
/// world cannot be borrowed).
fn spine_of<'c>(
    config: &'c Config,
    root: &Path,
    calls: &Rc<RefCell<Vec<String>>>,
    fail: Option<&'static str>,
    origin: &'static str,
) -> Spine<'c> {
    let layers: Vec<Box<dyn Layer>> = ["first", "second", "third"]
        .into_iter()
        .map(|name| {
            Box::new(FileLayer {
                name,
                dir: root.join("made"),
                fail_make: fail == Some(name),
                volatile: name == "second",
                calls: calls.clone(),
            }) as Box<dyn Layer>
        })
        .collect();
    Spine::new(config, layers, origin).unwrap()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
    pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
}

fn job_env(job: &str) -> Vec<(OsString, OsString)> {
    env(&[
        ("SLURM_JOB_ID", job),
        ("SLURM_JOB_UID", "0"),
        ("SLURM_JOB_GID", "0"),
        ("SLURM_JOB_USER", "root"),
        ("SLURMD_NODENAME", "node1"),
        ("SPANK_TENANCY_TENANT", "acme"),
    ])
}

fn ctx(job: &str) -> Result<JobContext, tenancy_job::EnvError> {
    JobContext::from_vars(job_env(job))
}

#[test]
fn prolog_journals_then_epilog_tears_down_and_the_chain_verifies() {
    let w = World::new();
    let end = w.spine(None, "tenancy-prolog").prolog(ctx("42"));
    assert_eq!(end.code, 0, "{}", end.message);
    assert_eq!(w.made_files(), ["first-42", "second-42", "third-42"]);
    let journal = tenancy_job::JournalDir::open(&w.config.cluster.state_dir)
        .unwrap()
        .load(42)
        .unwrap()
        .expect("journal");
    assert_eq!(journal.tenant, "acme");
    assert!(journal.steps.iter().all(|s| s.state == StepState::Made));
    assert_eq!(journal.steps.len(), 3);

    let end = w.spine(None, "tenancy-epilog").epilog(&ctx("42").unwrap());
    assert_eq!(end.code, 0, "{}", end.message);
    assert!(w.made_files().is_empty());
    assert!(!w.config.cluster.state_dir.join("job_42.json").exists());
    let calls = w.calls.borrow().clone();
    let undo: Vec<_> = calls.iter().filter(|c| c.starts_with("undo")).collect();
    assert_eq!(
        undo,
        [
            "undo third made=true",
            "undo second made=true",
            "undo first made=true"
        ]
    );

    // A second epilog is harmless and records that nothing was left.
    let end = w.spine(None, "tenancy-epilog").epilog(&ctx("42").unwrap());
    assert_eq!(end.code, 0, "{}", end.message);

    let recs = w.records();
    let events: Vec<_> = recs.iter().map(|r| r.event.clone()).collect();
    assert_eq!(events, [Event::JobStart, Event::JobEnd, Event::JobEnd]);
    assert_eq!(recs[0].resources.len(), 3);
    assert_eq!(recs[1].resources.len(), 3);
    assert_eq!(recs[1].tenant.as_deref(), Some("acme"));
    assert!(recs[1].started.is_some());
    assert!(w.chain_is_valid());
}

#[test]
fn every_intent_is_journaled_before_the_first_make_and_a_make_sees_the_earlier_results() {
    let w = World::new();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let layers: Vec<Box<dyn Layer>> = [("mig", "none"), ("devices", "mig")]
        .into_iter()
        .map(|(name, before)| {
            Box::new(Witness {
                name,
                before,
                state_dir: w.config.cluster.state_dir.clone(),
                seen: seen.clone(),
            }) as Box<dyn Layer>
        })
        .collect();
    let end = Spine::new(&w.config, layers, "tenancy-prolog")
        .unwrap()
        .prolog(ctx("43"));
    assert_eq!(end.code, 0, "{}", end.message);
    // One write holds both intents before anything is made (each layer reads them back); the
    // device layer still gets the MIG result it needs.
    assert_eq!(
        *seen.borrow(),
        [
            r#"mig sees intents ["mig", "devices"] on disk, none made: false"#,
            r#"devices sees intents ["mig", "devices"] on disk, mig made: true"#,
        ]
    );
}

/// The calls of a prolog with layers `(name, volatile)` and its boundaries, in order.
fn calls_and_boundaries(w: &World, layers: &[(&'static str, bool)], job: &str) -> Vec<String> {
    let layers: Vec<Box<dyn Layer>> = layers
        .iter()
        .map(|&(name, volatile)| {
            Box::new(FileLayer {
                name,
                dir: w.root.join("made"),
                fail_make: false,
                volatile,
                calls: w.calls.clone(),
            }) as Box<dyn Layer>
        })
        .collect();
    let mut spine = Spine::new(&w.config, layers, "tenancy-prolog").unwrap();
    let calls = w.calls.clone();
    spine.boundary_hook = Some(Box::new(move |b| {
        if b == tenancy_node::Boundary::IntentsOnDisk {
            calls.borrow_mut().push("intents on disk".to_string());
        }
    }));
    w.calls.borrow_mut().clear();
    let end = spine.prolog(ctx(job));
    assert_eq!(end.code, 0, "{}", end.message);
    w.calls.borrow().clone()
}

#[test]
fn layers_a_restart_removes_act_while_the_intents_reach_the_disk_the_others_after() {
    let w = World::new();
    // Volatile layers first (MIG, devices, network in the product): they act while the write
    // is under way, and the wait comes just before the first layer that outlives a restart.
    assert_eq!(
        calls_and_boundaries(
            &w,
            &[("mig", true), ("devices", true), ("scratch", false)],
            "60"
        ),
        [
            "intend mig",
            "intend devices",
            "intend scratch",
            "make mig",
            "make devices",
            "intents on disk",
            "make scratch"
        ]
    );
    // A lasting layer first: the intents are on disk before anything is made, and waited for
    // once.
    assert_eq!(
        calls_and_boundaries(
            &w,
            &[("first", false), ("second", true), ("third", false)],
            "61"
        ),
        [
            "intend first",
            "intend second",
            "intend third",
            "intents on disk",
            "make first",
            "make second",
            "make third"
        ]
    );
    // Only volatile layers: nothing of the job outlives a restart, so nothing waits.
    assert_eq!(
        calls_and_boundaries(&w, &[("mig", true), ("devices", true)], "62"),
        ["intend mig", "intend devices", "make mig", "make devices"]
    );
    // Each job holds a slot of the intent log meanwhile, with all its intents.
    let dir = tenancy_job::JournalDir::open(&w.config.cluster.state_dir).unwrap();
    for job in [60, 61, 62] {
        let j = dir.load(job).unwrap().unwrap();
        assert!(j.intent_slot.is_some(), "job {job}: {j:?}");
    }
}

#[test]
fn a_failing_layer_undoes_the_earlier_ones_in_reverse_and_fails_closed() {
    let w = World::new();
    let end = w.spine(Some("second"), "tenancy-prolog").prolog(ctx("7"));
    assert_eq!(end.code, 1);
    assert!(
        end.message.contains("job 7: layer second:"),
        "{}",
        end.message
    );
    assert!(end.message.contains("injected failure"), "{}", end.message);
    assert!(
        w.made_files().is_empty(),
        "left behind: {:?}",
        w.made_files()
    );
    assert!(!w.config.cluster.state_dir.join("job_7.json").exists());
    let calls = w.calls.borrow().clone();
    assert_eq!(
        calls,
        [
            // Independent layers are intended (one journal write), then made in order; the
            // third was never acted on.
            "intend first",
            "intend second",
            "intend third",
            "make first",
            "make second",
            // The failed layer is undone too: its intent was journaled, it may have half-made.
            "undo second made=false",
            "undo first made=true",
        ]
    );
    let recs = w.records();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].event, Event::Rollback);
    let removed: Vec<_> = recs[0].resources.iter().map(|r| r.layer.as_str()).collect();
    assert_eq!(removed, ["second", "first"]);
    assert!(recs[0]
        .reason
        .as_deref()
        .unwrap()
        .contains("injected failure"));
    assert!(w.chain_is_valid());
}

#[test]
fn bad_environment_is_denied_with_a_record_and_nothing_made() {
    let w = World::new();
    let cases: Vec<(Vec<(OsString, OsString)>, &str)> = vec![
        (
            job_env("1")
                .into_iter()
                .filter(|(k, _)| k != "SLURM_JOB_ID")
                .collect(),
            "SLURM_JOB_ID is missing",
        ),
        (
            job_env("2")
                .into_iter()
                .map(|(k, v)| {
                    if k == "SLURM_JOB_UID" {
                        (k, "zero".into())
                    } else {
                        (k, v)
                    }
                })
                .collect(),
            "SLURM_JOB_UID is not a number",
        ),
    ];
    for (vars, want) in cases {
        let end = w
            .spine(None, "tenancy-prolog")
            .prolog(JobContext::from_vars(vars));
        assert_eq!(end.code, 1);
        assert!(end.message.contains(want), "{}", end.message);
    }
    let mut vars = job_env("3");
    vars.retain(|(k, _)| k != "SPANK_TENANCY_TENANT");
    vars.push(("SPANK_TENANCY_TENANT".into(), "../etc".into()));
    let end = w
        .spine(None, "tenancy-prolog")
        .prolog(JobContext::from_vars(vars));
    assert_eq!(end.code, 1);
    assert!(
        end.message.contains("'../etc' is not a tenant name"),
        "{}",
        end.message
    );
    // A user who is not a member.
    let mut vars = job_env("4");
    for (k, v) in vars.iter_mut() {
        if k == "SLURM_JOB_UID" {
            *v = "1".into();
        }
        if k == "SLURM_JOB_USER" {
            *v = "daemon".into();
        }
    }
    let end = w
        .spine(None, "tenancy-prolog")
        .prolog(JobContext::from_vars(vars));
    assert!(
        end.message
            .contains("user daemon is not a member of tenant 'acme' (members need group root)"),
        "{}",
        end.message
    );

    assert!(
        w.calls.borrow().is_empty(),
        "a layer was called: {:?}",
        w.calls.borrow()
    );
    assert!(w.made_files().is_empty());
    let recs = w.records();
    assert_eq!(recs.len(), 4);
    assert!(recs.iter().all(|r| r.event == Event::JobDenied));
    assert_eq!(recs[0].job_id, None);
    assert_eq!(recs[1].job_id, Some(2));
    assert!(recs[1].reason.as_deref().unwrap().contains("SLURM_JOB_UID"));
    assert!(w.chain_is_valid());
}

#[test]
fn epilog_after_a_crashed_prolog_undoes_intended_steps() {
    let w = World::new();
    // The prolog died after journaling the second intent and making it, before recording it.
    let end = w.spine(None, "tenancy-prolog").prolog(ctx("9"));
    assert_eq!(end.code, 0);
    let dir = tenancy_job::JournalDir::open(&w.config.cluster.state_dir).unwrap();
    let mut j = dir.load(9).unwrap().unwrap();
    j.steps.truncate(2);
    j.steps[1].state = StepState::Intended;
    j.steps[1].made = None;
    dir.save(&j, true).unwrap();
    std::fs::remove_file(w.root.join("made/third-9")).unwrap();
    w.calls.borrow_mut().clear();
    let end = w.spine(None, "tenancy-epilog").epilog(&ctx("9").unwrap());
    assert_eq!(end.code, 0, "{}", end.message);
    assert!(w.made_files().is_empty());
    assert_eq!(
        *w.calls.borrow(),
        ["undo second made=false", "undo first made=true"]
    );
}

#[test]
fn epilog_of_a_journal_from_an_earlier_boot_undoes_only_what_outlives_a_restart() {
    let w = World::new();
    let end = w.spine(None, "tenancy-prolog").prolog(ctx("9"));
    assert_eq!(end.code, 0);
    let dir = tenancy_job::JournalDir::open(&w.config.cluster.state_dir).unwrap();
    let mut j = dir.load(9).unwrap().unwrap();
    assert!(j.boot_id.is_some() && !j.from_earlier_boot());
    j.boot_id = Some("ee".repeat(16));
    j.started = tenancy_job::intent_log::booted_at().unwrap() - chrono::Duration::minutes(5);
    assert!(j.from_earlier_boot());
    dir.save(&j, false).unwrap();
    w.calls.borrow_mut().clear();
    let end = w.spine(None, "tenancy-epilog").epilog(&ctx("9").unwrap());
    assert_eq!(end.code, 0, "{}", end.message);
    // "second" is volatile: what stands in its place now is not this job's.
    assert_eq!(
        *w.calls.borrow(),
        ["undo third made=true", "undo first made=true"]
    );
    assert_eq!(w.made_files(), ["second-9"]);
    assert_eq!(dir.load(9).unwrap(), None);
}

#[test]
fn epilog_without_journal_exits_zero_and_says_so() {
    let w = World::new();
    let end = w.spine(None, "tenancy-epilog").epilog(&ctx("5").unwrap());
    assert_eq!(end.code, 0);
    let recs = w.records();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].event, Event::JobEnd);
    assert!(recs[0].reason.as_deref().unwrap().contains("no journal"));
}

#[test]
fn unwritable_audit_log_fails_the_prolog_closed() {
    let w = World::new();
    let mut config = w.config.clone();
    config.cluster.audit_log = Path::new("/proc/no-such-dir/audit.jsonl").to_path_buf();
    let layers: Vec<Box<dyn Layer>> = vec![Box::new(FileLayer {
        name: "first",
        dir: w.root.join("made"),
        fail_make: false,
        volatile: false,
        calls: w.calls.clone(),
    })];
    let end = Spine::new(&config, layers, "tenancy-prolog")
        .unwrap()
        .prolog(ctx("11"));
    assert_eq!(end.code, 1);
    assert!(end.message.contains("audit"), "{}", end.message);
    assert!(
        w.made_files().is_empty(),
        "job resources left without a record"
    );
}

#[test]
fn an_unreadable_earlier_journal_fails_the_prolog_instead_of_being_overwritten() {
    let w = World::new();
    let dir = tenancy_job::JournalDir::open(&w.config.cluster.state_dir).unwrap();
    std::fs::write(dir.journal_path(13), b"{torn").unwrap();
    let end = w.spine(None, "tenancy-prolog").prolog(ctx("13"));
    assert_eq!(end.code, 1);
    assert!(end.message.contains("cannot be read"), "{}", end.message);
    assert!(
        w.calls.borrow().is_empty(),
        "a layer ran: {:?}",
        w.calls.borrow()
    );
    assert_eq!(std::fs::read(dir.journal_path(13)).unwrap(), b"{torn");
    let recs = w.records();
    assert_eq!(recs.last().unwrap().event, Event::TeardownFailed);
}

/// Every record but a `job_start` anchors the chain head outside the log (here the
/// `cluster.audit_anchor` file): a refusal, a rollback or a job end cut off the log before
/// the next job end shows in `audit verify`. A `job_start` is covered by its job's `job_end`.
#[test]
fn every_record_but_a_job_start_is_anchored() {
    let w = World::with_cluster(|c, r| {
        c.cluster().audit_anchor(r.join("anchors"));
    });
    let anchored = || -> Vec<u64> {
        std::fs::read_to_string(w.root.join("anchors"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|t| t.strip_prefix("seq="))
                    .map(|n| n.parse().unwrap())
            })
            .collect()
    };
    assert_eq!(w.spine(None, "tenancy-prolog").prolog(ctx("43")).code, 0);
    assert_eq!(anchored(), Vec::<u64>::new(), "a job_start was anchored");
    let denied: Vec<_> = job_env("44")
        .into_iter()
        .map(|(k, v)| match k.to_str() {
            Some("SPANK_TENANCY_TENANT") => (k, "globex".into()),
            _ => (k, v),
        })
        .collect();
    assert_eq!(
        w.spine(None, "tenancy-prolog")
            .prolog(JobContext::from_vars(denied))
            .code,
        1
    );
    assert_eq!(
        w.spine(Some("second"), "tenancy-prolog")
            .prolog(ctx("45"))
            .code,
        1
    );
    assert_eq!(
        w.spine(None, "tenancy-epilog")
            .epilog(&ctx("43").unwrap())
            .code,
        0
    );
    let recs = w.records();
    let events: Vec<(Event, u64)> = recs.iter().map(|r| (r.event.clone(), r.seq)).collect();
    assert_eq!(
        events.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        [
            Event::JobStart,
            Event::JobDenied,
            Event::Rollback,
            Event::JobEnd
        ]
    );
    assert_eq!(anchored(), [events[1].1, events[2].1, events[3].1]);
}

/// With `cluster.audit_anchor_key`, the prolog's and epilog's anchors carry the key's MAC, and
/// a verify with the key takes them all; one with another key takes none.
#[test]
fn anchors_carry_the_mac_of_the_configured_key() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::with_cluster(|c, r| {
        c.cluster()
            .audit_anchor(r.join("anchors"))
            .audit_anchor_key(r.join("anchor.key"));
    });
    let key = w.root.join("anchor.key");
    std::fs::write(&key, b"0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(w.spine(None, "tenancy-prolog").prolog(ctx("43")).code, 0);
    assert_eq!(
        w.spine(None, "tenancy-epilog")
            .epilog(&ctx("43").unwrap())
            .code,
        0
    );
    let verify = |key: tenancy_audit_log::AnchorKey| {
        let mut set = AnchorSet::with_key(key);
        set.read_file(&w.root.join("anchors")).unwrap();
        verify_paths(&[w.root.join("audit.jsonl")], &set, 10).unwrap()
    };
    let r = verify(tenancy_audit_log::AnchorKey::load(&key).unwrap());
    assert!(r.is_clean(), "{:?}", r.findings);
    assert_eq!(
        (r.nodes[0].anchor_seq, r.unauthenticated_anchors),
        (Some(2), 0)
    );
    let r = verify(tenancy_audit_log::AnchorKey::from_bytes(
        b"another key, another cluster",
    ));
    assert_eq!(
        (r.nodes[0].anchor_seq, r.unauthenticated_anchors),
        (None, 1)
    );
}

/// Two prologs of one job on a node (slurmd restarted under one, a prolog run by hand): another
/// runs whole while this one is between its look for an earlier attempt's journal and the node
/// lock. This one then makes nothing and refuses, leaving the other's journal and resources
/// alone (its own journal written over them would leave them to nothing that undoes them, and
/// its rollback would remove that journal), and the job's epilog removes them all.
#[test]
fn a_prolog_overtaken_by_another_of_its_job_makes_nothing_and_leaves_the_others_journal() {
    let w = World::new();
    let (config, root, calls) = (w.config.clone(), w.root.clone(), w.calls.clone());
    let second_end = Rc::new(RefCell::new(None));
    let end_of_second = second_end.clone();
    let mut first = w.spine(None, "tenancy-prolog");
    first.boundary_hook = Some(Box::new(move |b| {
        if b == tenancy_node::Boundary::Checked && end_of_second.borrow().is_none() {
            let mut second = spine_of(&config, &root, &calls, None, "tenancy-prolog");
            *end_of_second.borrow_mut() = Some(second.prolog(ctx("77")));
        }
    }));
    let end = first.prolog(ctx("77"));
    drop(first);
    let second = second_end
        .borrow_mut()
        .take()
        .expect("the second prolog ran");
    assert_eq!(second.code, 0, "{}", second.message);
    assert_ne!(end.code, 0, "the first prolog went on: {}", end.message);
    assert!(
        end.message.contains("another prolog of this job"),
        "{}",
        end.message
    );
    assert_eq!(w.made_files(), ["first-77", "second-77", "third-77"]);
    let journal = tenancy_job::JournalDir::open(&w.config.cluster.state_dir)
        .unwrap()
        .load(77)
        .unwrap()
        .expect("the second prolog's journal");
    assert!(journal.steps.iter().all(|s| s.state == StepState::Made));
    let made: Vec<_> = w
        .calls
        .borrow()
        .iter()
        .filter(|c| c.starts_with("make"))
        .cloned()
        .collect();
    assert_eq!(
        made,
        ["make first", "make second", "make third"],
        "the first prolog made something"
    );

    let end = w.spine(None, "tenancy-epilog").epilog(&ctx("77").unwrap());
    assert_eq!(end.code, 0, "{}", end.message);
    assert!(w.made_files().is_empty());
    let events: Vec<_> = w.records().iter().map(|r| r.event.clone()).collect();
    assert_eq!(events, [Event::JobStart, Event::JobDenied, Event::JobEnd]);
    assert!(w.chain_is_valid());
}
