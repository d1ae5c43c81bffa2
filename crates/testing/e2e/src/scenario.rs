//! The one way into an e2e scenario: [`scenario`] (or the [`crate::scenario!`] macro) does the
//! root guard, takes this test binary's serial lock, makes the users and groups, starts the
//! world the body asks for with the [`Options`] given, runs the body, and tears everything down
//! in order, also when the body panics.

use crate::{probe_kv, submitted_id, wait_line, Accounting, SlurmRoot, Stack, Tenants, TestUser};
use crate::{text, Users};
use anyhow::{Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tenancy_test_support::{requires_root, TenancyToml};

/// Names the Slurm release a scenario runs on when its options do not (a root made by
/// scripts/slurm-root); the host's own Slurm when unset: `TENANCY_TEST_SLURM_RELEASE=24.11
/// cargo test -p tenancy-e2e --test product` is the product's suite on 24.11.
pub const RELEASE_ENV: &str = "TENANCY_TEST_SLURM_RELEASE";

/// Which Slurm a scenario's cluster runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Slurm {
    /// The release [`RELEASE_ENV`] names, the host's when it is unset (the release switch).
    #[default]
    FromEnv,
    /// This machine's own Slurm (22.05 from Debian 12), whatever the switch says.
    Host,
    /// A release root (`24.11`, `26.05`): daemons and clients under chroot, the plugins built
    /// against its headers (release_root.rs).
    Release(String),
}

impl Slurm {
    /// The release's root (made when missing; an archive that cannot be reached is an error,
    /// a release is never skipped), or None for the host's Slurm.
    pub fn root(&self) -> Result<Option<SlurmRoot>> {
        let release = match self {
            Slurm::Host => return Ok(None),
            Slurm::Release(r) => r.clone(),
            Slurm::FromEnv => match std::env::var(RELEASE_ENV).ok().filter(|r| !r.is_empty()) {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        SlurmRoot::make(&release)
            .map(Some)
            .with_context(|| format!("Slurm {release}: its root"))
    }
}

/// A change to the product's tenancy.toml, made before the cluster starts.
pub type ConfigEdit = Arc<dyn Fn(&mut TenancyToml) + Send + Sync>;

/// What a scenario's world runs on; `Options::default()` is the product on one node, on the
/// Slurm [`RELEASE_ENV`] names. Which world (one node, several, the pure v2 node) is the type
/// the body takes: [`Env`], [`crate::MultiNode`], [`crate::PureV2Node`].
#[derive(Clone, Default)]
pub struct Options {
    /// The Slurm release (one node only; the other worlds run what they run).
    pub slurm: Slurm,
    /// Extra slurm.conf lines (`TaskEpilog=...`); `{acme_group}` and `{globex_group}` in them
    /// become the groups of the run's tenants (one node and several).
    pub slurm_conf: Vec<String>,
    /// Extra files next to slurm.conf (name, text), e.g. job_container.conf.
    pub files: Vec<(String, String)>,
    /// Where the scenario's folders are made (default the temp folder; jobs with a private
    /// /tmp need them elsewhere).
    pub folder_in: Option<PathBuf>,
    /// Slurm's own accounting (slurmdbd over MariaDB) with these GPU types.
    pub accounting: Option<Accounting>,
    /// Changes to the product's tenancy.toml, in order.
    pub config: Vec<ConfigEdit>,
    /// CPUs each node declares (default this machine's; more adds
    /// `SlurmdParameters=config_overrides`).
    pub cpus: Option<usize>,
    /// Several nodes: a syslog-over-TLS collector (rsyslog) beside slurmctld, and on each
    /// node `tenancyctl audit forward` as tenancy-audit-forward.service runs it.
    pub collector: bool,
    /// The multi-node cluster only: each node's audit folder on a file system of its own of
    /// this many MB (a loop device, src/audit_disk.rs), for the soak's `audit_disk_full`.
    pub audit_disk_mb: Option<u64>,
    /// H200-141GB GPUs (MIG mode on) that each node of the multi-node cluster has through the
    /// NVML stand-in, its state its own (0: no NVML on the nodes; the one-node stack always
    /// has two).
    pub node_gpus: usize,
}

impl Options {
    /// On the release `release` (`"24.11"`), whatever the switch says.
    pub fn release(release: &str) -> Options {
        Options {
            slurm: Slurm::Release(release.to_string()),
            ..Options::default()
        }
    }

    /// On this machine's own Slurm, whatever the switch says.
    pub fn host() -> Options {
        Options {
            slurm: Slurm::Host,
            ..Options::default()
        }
    }

    pub fn slurm_conf(mut self, line: impl Into<String>) -> Options {
        self.slurm_conf.push(line.into());
        self
    }

    pub fn file(mut self, name: &str, text: impl Into<String>) -> Options {
        self.files.push((name.to_string(), text.into()));
        self
    }

    pub fn folder_in(mut self, dir: impl Into<PathBuf>) -> Options {
        self.folder_in = Some(dir.into());
        self
    }

    pub fn accounting(mut self, accounting: Accounting) -> Options {
        self.accounting = Some(accounting);
        self
    }

    pub fn config(mut self, edit: impl Fn(&mut TenancyToml) + Send + Sync + 'static) -> Options {
        self.config.push(Arc::new(edit));
        self
    }

    /// Each node declares `n` CPUs (jobs of one CPU each: `n` fit on a node).
    pub fn cpus(mut self, n: usize) -> Options {
        self.cpus = Some(n);
        self
    }

    /// The audit collector and each node's forwarder ([`Options::collector`]).
    pub fn collector(mut self) -> Options {
        self.collector = true;
        self
    }

    /// Each node of the multi-node cluster keeps its audit log on a file system of its own
    /// (`mb` MB, [`crate::MultiNode::fill_audit_disk`]); where no loop device can be attached
    /// the cluster says so and runs without ([`crate::MultiNode::audit_disk_missing`]).
    pub fn audit_disk(mut self, mb: u64) -> Options {
        self.audit_disk_mb = Some(mb);
        self
    }

    /// Each node of the multi-node cluster gets `n` H200s through the NVML stand-in.
    pub fn node_gpus(mut self, n: usize) -> Options {
        self.node_gpus = n;
        self
    }
}

/// What a scenario's body gets: started from the options and the scenario's users, torn down
/// when it is dropped (before the users are).
pub trait World: Sized {
    fn start(options: &Options, users: &mut Users) -> Result<Self>;
}

/// The users alone: for a body that starts its clusters itself (several in a row, or a bare
/// Slurm cluster).
impl World for Users {
    fn start(_: &Options, _: &mut Users) -> Result<Users> {
        Ok(Users::new())
    }
}

/// Scenarios of one test binary run one after the other: users and groups are made by name.
/// (Clusters of all binaries, and other engineers' on this machine, wait for the e2e lock.)
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs the scenario `name`: skips it as non-root (a failure under CI), waits for the
/// binary's other scenarios, starts the world `W` with `options` and hands it to `body`.
pub fn scenario<W: World>(name: &str, options: Options, body: impl FnOnce(&mut W)) {
    if !requires_root(name) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut users = Users::new();
    let mut world = match W::start(&options, &mut users) {
        Ok(w) => w,
        Err(e) => match e.downcast_ref::<HostCannotRun>() {
            Some(why) => {
                eprintln!("SKIP {name}: {why}");
                return;
            }
            None => panic!("{name}: {e:#}"),
        },
    };
    body(&mut world);
}

/// A world this host cannot start at all, for a reason of the host's and not of the product
/// (the UML kernel on a host whose XSAVE area it cannot handle: uml_node.rs): the scenario
/// says SKIP with the reason, also under CI.
#[derive(Debug)]
pub struct HostCannotRun(pub String);

impl std::fmt::Display for HostCannotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HostCannotRun {}

/// `scenario!(name, options, |world: &mut W| { ... })` defines the test `name` that runs
/// [`scenario`] with `options`, on the world the closure takes.
#[macro_export]
macro_rules! scenario {
    ($name:ident, $options:expr, $body:expr $(,)?) => {
        #[test]
        fn $name() {
            $crate::scenario(stringify!($name), $options, $body)
        }
    };
}

/// The product on one node: its stack, the two tenants, and what a scenario does with them.
pub struct Env {
    pub stack: Stack,
    pub t: Tenants,
    _root: tempfile::TempDir,
}

impl World for Env {
    fn start(options: &Options, users: &mut Users) -> Result<Env> {
        let t = Tenants::create(users)?;
        let root = tempfile::Builder::new()
            .prefix("tenancy-e2e-stack-")
            .tempdir_in(options.folder_in.clone().unwrap_or_else(std::env::temp_dir))?;
        let stack = Stack::start(root.path(), &t, options)?;
        Ok(Env {
            stack,
            t,
            _root: root,
        })
    }
}

/// A batch script of a user's in their job folder, its output file and what sbatch hands it.
pub struct Job {
    pub script: PathBuf,
    pub out: PathBuf,
    pub args: Vec<String>,
}

impl Env {
    /// The probe every job runs (src/bin/tenancy-e2e-probe.rs), installed for the users.
    pub fn probe(&self) -> String {
        self.stack.bin("tenancy-e2e-probe").display().to_string()
    }

    /// `name.sh` in `user`'s job folder with `text` (one of scripts/jobs/), output `name.out`,
    /// `args` its arguments.
    pub fn job(&self, user: &TestUser, name: &str, text: &str, args: &[&str]) -> Job {
        let dir = self.stack.cluster.user_dir(user);
        let script = dir.join(format!("{name}.sh"));
        fs::write(&script, text).unwrap();
        Job {
            script,
            out: dir.join(format!("{name}.out")),
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// A job that runs the probe once per step, each step its words (`env`, `envwait FILE`,
    /// `serve PORT FILE`): scripts/jobs/probe.sh.
    pub fn probe_job(&self, user: &TestUser, name: &str, steps: &[&str]) -> Job {
        let probe = self.probe();
        let mut args = vec![probe.as_str()];
        args.extend(steps);
        self.job(user, name, include_str!("../scripts/jobs/probe.sh"), &args)
    }

    /// `sbatch ARGS -o OUT SCRIPT SCRIPT_ARGS` as `user`; the job's id.
    pub fn sbatch(&self, user: &TestUser, args: &[&str], job: &Job) -> u64 {
        let mut c = self.stack.cluster.cmd_as(user, "sbatch");
        c.args(args)
            .arg("-o")
            .arg(&job.out)
            .arg(&job.script)
            .args(&job.args);
        let o = self.stack.cluster.run(c).unwrap();
        assert!(
            o.status.success(),
            "sbatch {args:?} as {}: {}",
            user.name,
            text(&o.stderr)
        );
        submitted_id(&o).unwrap()
    }

    /// [`Env::sbatch`], then the job must complete within `timeout`; its id.
    pub fn completes(&self, user: &TestUser, args: &[&str], job: &Job, timeout: Duration) -> u64 {
        let id = self.sbatch(user, args, job);
        let info = self.stack.cluster.wait_job_done(id, timeout).unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
        id
    }

    /// `sbatch ARGS` as `user`, as it came out.
    pub fn sbatch_raw(&self, user: &TestUser, args: &[&str]) -> Output {
        let mut c = self.stack.cluster.cmd_as(user, "sbatch");
        c.args(args);
        self.stack.cluster.run(c).unwrap()
    }

    /// `srun --jobid=JOB --overlap PROBE ARGS` as `user`: a new step inside a running job.
    pub fn step(&self, user: &TestUser, job: u64, args: &[&str]) -> Output {
        let mut c = self.stack.cluster.cmd_as(user, "srun");
        c.arg(format!("--jobid={job}"))
            .args(["--overlap", "-n1", "-N1"])
            .arg(self.probe())
            .args(args);
        self.stack.cluster.run(c).unwrap()
    }

    /// Runs the probe in a new step of `job` and returns the value it printed for `key`.
    pub fn step_says(&self, user: &TestUser, job: u64, args: &[&str], key: &str) -> String {
        let o = self.step(user, job, args);
        let kv = probe_kv(&text(&o.stdout));
        kv.get(key).cloned().unwrap_or_else(|| {
            panic!(
                "step of job {job} as {} ({args:?}) printed no {key}: stdout {:?} stderr {:?}",
                user.name,
                text(&o.stdout),
                text(&o.stderr)
            )
        })
    }

    /// An acme job that runs the probe's `acme_first` steps, then reports and waits, beside a
    /// globex job that reports and waits, both running when this returns; see [`Env::release`].
    pub fn hold_two(&self, name: &str, acme_first: &[&str]) -> Held {
        let release = self.stack.cluster.path(&format!("jobs/release-{name}"));
        let wait = format!("envwait {}", release.display());
        let mut steps = acme_first.to_vec();
        steps.push(&wait);
        let a_job = self.probe_job(&self.t.acme1, &format!("{name}-a"), &steps);
        let g_job = self.probe_job(&self.t.globex1, &format!("{name}-g"), &[&wait]);
        let a = self.sbatch(&self.t.acme1, &["--tenant=acme"], &a_job);
        let g = self.sbatch(&self.t.globex1, &["--tenant=globex"], &g_job);
        let a_text = wait_output(&a_job.out, "uid=", Duration::from_secs(60));
        wait_output(&g_job.out, "uid=", Duration::from_secs(60));
        Held {
            a,
            g,
            a_text,
            release,
        }
    }

    /// Lets the jobs of [`Env::hold_two`] end; both must complete.
    pub fn release(&self, held: &Held) {
        self.end_jobs(&held.release, &[held.a, held.g], Duration::from_secs(60));
    }

    /// Makes the file `release` the jobs `ids` wait for; each must complete within `timeout`.
    pub fn end_jobs(&self, release: &Path, ids: &[u64], timeout: Duration) {
        fs::write(release, "").unwrap();
        for &id in ids {
            let info = self.stack.cluster.wait_job_done(id, timeout).unwrap();
            assert_eq!(info["JobState"], "COMPLETED", "job {id}: {info:?}");
        }
    }

    /// `tenancyctl --config <the stack's> ARGS` as root.
    pub fn ctl(&self, args: &[&str]) -> Output {
        let mut c = self.stack.tenancyctl();
        c.args(args);
        self.stack.cluster.run(c).unwrap()
    }

    /// No job exists, and the node is idle with no drain reason.
    pub fn assert_no_job_and_node_idle(&self) {
        let mut q = self.stack.cluster.cmd("squeue");
        q.args(["-h", "-a", "-o", "%A"]);
        let queued = text(&self.stack.cluster.run(q).unwrap().stdout);
        assert_eq!(queued.trim(), "", "jobs were made: {queued}");
        self.assert_node_idle();
    }

    /// The node takes jobs (idle, or running some) and has no drain reason.
    pub fn assert_node_idle(&self) {
        let state = self.stack.cluster.node_state().unwrap();
        let reason = self.stack.cluster.node_reason().unwrap();
        assert!(
            matches!(state.as_str(), "idle" | "alloc" | "mix") && reason.is_empty(),
            "node is {state} ({reason})"
        );
    }

    /// Rewrites the stack's tenancy.toml (read on every submission and every prolog).
    pub fn edit_config(&self, from: &str, to: &str) {
        let text = fs::read_to_string(&self.stack.config).unwrap();
        assert!(text.contains(from), "{from:?} not in the config");
        fs::write(&self.stack.config, text.replacen(from, to, 1)).unwrap();
    }

    pub fn job_state(&self, id: u64) -> String {
        self.stack.cluster.job_info(id).unwrap()["JobState"].clone()
    }
}

/// The two jobs of [`Env::hold_two`]: acme's and globex's, acme's output when it reported, and
/// the file that releases both.
pub struct Held {
    pub a: u64,
    pub g: u64,
    pub a_text: String,
    pub release: PathBuf,
}

/// Waits until `path` holds a line starting with `prefix`; returns the whole file (panics
/// after `timeout`).
pub fn wait_output(path: &Path, prefix: &str, timeout: Duration) -> String {
    wait_line(path, prefix, timeout).unwrap_or_else(|e| panic!("{e:#}"))
}
