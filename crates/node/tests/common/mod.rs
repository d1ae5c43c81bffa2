//! Harness of the reliability tests: a node world with real users and groups, the NVML shim,
//! the real layers (MIG through the shim, v2 BPF device programs on product cgroups, scratch),
//! and the `crash_prolog` example as the prolog/epilog process.
#![allow(dead_code)]

use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use tenancy_accounting::verify_paths;
use tenancy_audit_log::{AnchorSet, Record};

pub use tenancy_test_support::loopfs;

/// What a command did, for a failure message.
pub use tenancy_test_support::output_text as text;
pub use tenancy_test_support::{built_or_skip, nvml_stand_in, requires_root, target_dir};
use tenancy_test_support::{ScratchOnExit, TenancyToml};

/// The crash_prolog example, built by `cargo test`.
pub fn driver() -> PathBuf {
    let p = target_dir().join("examples").join("crash_prolog");
    assert!(
        p.exists(),
        "{} missing: run the tests with `cargo test -p tenancy-node` (it builds examples)",
        p.display()
    );
    p
}

fn run_quiet(cmd: &str, args: &[&str]) -> bool {
    // useradd/groupadd take /etc/passwd locks: other tests may hold them for a moment.
    for _ in 0..50 {
        let out = Command::new(cmd).args(args).output().unwrap();
        if out.status.success() {
            return true;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.contains("lock") {
            eprintln!("{cmd} {args:?}: {err}");
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A user of one tenant: name, uid, gid (the tenant's group is the primary group).
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Everything a test's node needs, removed on drop (users, groups, leftover cgroups).
pub struct World {
    /// The scratch root's own file system, when the world has one (unmounted before `tmp`
    /// goes: fields drop in order).
    pub scratch_fs: Option<loopfs::LoopFs>,
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub config_path: PathBuf,
    pub config: tenancy_config::Config,
    /// The text of `config_path` ([`World::rewrite_config`] changes the file).
    pub toml: TenancyToml,
    pub tenants: Vec<String>,
    pub users: Vec<User>,
    pub shim: PathBuf,
    pub node: String,
    /// The network namespace the prologs and epilogs run in: the product's nft table is
    /// loaded there, not in the host's namespace other tests share.
    pub netns: String,
}

pub const CGROUP2: &str = "/sys/fs/cgroup/unified";

impl World {
    /// `gpus` H200s in the shim; two tenants (one user each) on the `internal` tier.
    /// `audit_log` replaces the default audit log path when given.
    pub fn new(gpus: usize, audit_log: Option<&Path>) -> Option<World> {
        World::build(gpus, audit_log, None)
    }

    /// A world whose scratch root is a file system of `kind` of its own (64 MB), and whose
    /// tiers require `scratch_encryption`: tenant 0 on `internal` (wiped), tenant 1 on
    /// `keeper` (retained 1 day).
    pub fn encrypted(gpus: usize, kind: loopfs::Kind) -> Option<World> {
        World::build(gpus, None, Some(kind))
    }

    fn build(gpus: usize, audit_log: Option<&Path>, fs: Option<loopfs::Kind>) -> Option<World> {
        let shim = nvml_stand_in()?;
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let tag = format!("rl{}x{n}", std::process::id());
        let tmp = tempfile::Builder::new().prefix(&tag).tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let tenants = vec![format!("{tag}a"), format!("{tag}b")];
        let mut users = Vec::new();
        for t in &tenants {
            let uname = format!("{t}u");
            assert!(run_quiet("groupadd", &[t]), "groupadd {t}");
            assert!(
                run_quiet(
                    "useradd",
                    &["-M", "-N", "-g", t, "-s", "/usr/sbin/nologin", &uname]
                ),
                "useradd {uname}"
            );
            let id = |flag: &str| -> u32 {
                let out = Command::new("id").args([flag, &uname]).output().unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            };
            users.push(User {
                uid: id("-u"),
                gid: id("-g"),
                name: uname,
            });
        }
        std::fs::create_dir(root.join("scratch")).unwrap();
        let scratch_fs = fs.map(|kind| loopfs::LoopFs::new(kind, &root.join("scratch"), 64));
        tenancy_test_support::nvml_fixture(&root, gpus);
        let audit = audit_log
            .map(Path::to_path_buf)
            .unwrap_or_else(|| root.join("audit.jsonl"));
        let mut toml = TenancyToml::under("rel", &root);
        toml.cluster().audit_log(&audit);
        toml.nvml_stand_in(&root, &shim);
        toml.tier("internal").mig_profiles(["1g.18gb", "3g.71gb"]);
        toml.tier("keeper")
            .mig_profiles(["1g.18gb"])
            .scratch_on_exit(ScratchOnExit::Retain)
            .retain_days(1);
        // Encrypted: tenant 1 on the retaining tier, both tiers requiring encryption.
        if fs.is_some() {
            for tier in ["internal", "keeper"] {
                toml.tier(tier).scratch_encryption("required");
            }
        }
        for (i, t) in tenants.iter().enumerate() {
            let tier = if fs.is_some() && i == 1 {
                "keeper"
            } else {
                "internal"
            };
            toml.tenant(t).tier(tier).groups([t]);
        }
        let config_path = root.join("tenancy.toml");
        std::fs::write(&config_path, toml.to_string()).unwrap();
        let config = tenancy_config::Config::parse(&toml.to_string(), &config_path).unwrap();
        let netns = tag.clone();
        assert!(
            run_quiet("ip", &["netns", "add", &netns]),
            "ip netns add {netns}"
        );
        let w = World {
            scratch_fs,
            tmp,
            root,
            config_path,
            config,
            toml,
            tenants,
            users,
            shim,
            node: "node1".into(),
            netns,
        };
        // The driver is loaded at boot: /proc/devices and mig-minors exist before any job.
        let out = w.run(&["driver-load"], &[]);
        assert!(out.status.success(), "driver load: {}", text(&out));
        // `tenancyctl firewall apply`: tenant cgroups and the table, before any job.
        let out = w.run(&["firewall-apply"], &[]);
        assert!(out.status.success(), "firewall apply: {}", text(&out));
        Some(w)
    }

    /// Rewrites the config file with `edit` applied to [`World::toml`] (the drivers read it on
    /// every run; `config` stays as parsed at the start).
    pub fn rewrite_config(&self, edit: impl FnOnce(&mut TenancyToml)) {
        let mut toml = self.toml.clone();
        edit(&mut toml);
        std::fs::write(&self.config_path, toml.to_string()).unwrap();
    }

    /// The product's nft table in the world's namespace, as `nft list` prints it.
    pub fn nft_table(&self) -> String {
        let out = Command::new("/usr/bin/nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .args(["/usr/sbin/nft", "list", "table", "inet", "tenancy"])
            .output()
            .unwrap();
        assert!(out.status.success(), "nft list: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The Slurm variables of a job of tenant `t` (0 or 1), with `profile` as `--mig`.
    pub fn job_env(&self, job: u64, t: usize, profile: Option<&str>) -> Vec<(OsString, OsString)> {
        let u = &self.users[t];
        let mut v: Vec<(OsString, OsString)> = vec![
            ("SLURM_JOB_ID".into(), job.to_string().into()),
            ("SLURM_JOB_UID".into(), u.uid.to_string().into()),
            ("SLURM_JOB_GID".into(), u.gid.to_string().into()),
            ("SLURM_JOB_USER".into(), u.name.clone().into()),
            ("SLURMD_NODENAME".into(), self.node.clone().into()),
            ("SLURM_CLUSTER_NAME".into(), "rel".into()),
            (
                "SPANK_TENANCY_TENANT".into(),
                self.tenants[t].clone().into(),
            ),
        ];
        if let Some(p) = profile {
            v.push(("SPANK_TENANCY_MIG".into(), p.into()));
        }
        v
    }

    /// Runs the driver (`prolog [--crash-at N]` or `epilog`) with exactly this environment.
    pub fn run(&self, args: &[&str], env: &[(OsString, OsString)]) -> Output {
        self.command(args, env).output().unwrap()
    }

    /// A whole prolog of `job` (tenant 0, a 1g.18gb slice), which must succeed: the boundaries
    /// it reports, in order.
    pub fn prolog_boundaries(&self, job: u64) -> Vec<String> {
        let out = self.run(&["prolog"], &self.job_env(job, 0, Some("1g.18gb")));
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("boundary "))
            .map(|l| l.split_once(' ').unwrap().1.to_string())
            .collect()
    }

    /// The driver as a command (nsenter execs it: the child's pid is the driver's).
    pub fn command(&self, args: &[&str], env: &[(OsString, OsString)]) -> Command {
        self.command_of(&driver(), args, env)
    }

    /// `program` as the driver runs: in the world's network namespace, with exactly `env`
    /// and the world's config.
    pub fn command_of(
        &self,
        program: &Path,
        args: &[&str],
        env: &[(OsString, OsString)],
    ) -> Command {
        let mut c = Command::new("/usr/bin/nsenter");
        c.arg(format!("--net=/run/netns/{}", self.netns))
            .arg(program)
            .args(args)
            .env_clear()
            .envs(env.iter().cloned())
            .env("TENANCY_CONFIG", &self.config_path);
        c
    }

    pub fn journal_path(&self, job: u64) -> PathBuf {
        self.root.join("state").join(format!("job_{job}.json"))
    }

    /// The job's journal as the product reads it (the last snapshot of the file), as JSON.
    #[allow(dead_code)]
    pub fn journal(&self, job: u64) -> serde_json::Value {
        let j = tenancy_job::JournalDir::at(&self.root.join("state"))
            .load(job)
            .unwrap()
            .unwrap_or_else(|| panic!("job {job} has no journal"));
        serde_json::to_value(j).unwrap()
    }

    /// The `layer` step of the job's journal, if it has one.
    pub fn journal_step(&self, job: u64, layer: &str) -> Option<Value> {
        let j = self.journal(job);
        let steps = j["steps"].as_array().unwrap();
        steps.iter().find(|s| s["layer"] == layer).cloned()
    }

    /// The journals the node's intent log holds on disk (job id, journal), in slot order.
    pub fn intent_records(&self) -> Vec<(u64, tenancy_job::Journal)> {
        let Some(log) =
            tenancy_job::intent_log::IntentLog::open_existing(&self.root.join("state")).unwrap()
        else {
            return vec![];
        };
        log.records()
            .unwrap()
            .into_iter()
            .map(|r| (r.job_id, serde_json::from_slice(&r.payload).unwrap()))
            .collect()
    }

    pub fn journals(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.root.join("state")) else {
            return vec![];
        };
        let mut v: Vec<String> = rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("job_") || n.ends_with(".tmp"))
            .collect();
        v.sort();
        v
    }

    pub fn cgroup(&self, t: usize, job: u64) -> PathBuf {
        Path::new(CGROUP2)
            .join("tenancy")
            .join(&self.tenants[t])
            .join(format!("job_{job}"))
    }

    /// Job cgroups of this world's tenants that still exist.
    pub fn cgroups(&self) -> Vec<PathBuf> {
        let mut v = Vec::new();
        for t in &self.tenants {
            let dir = Path::new(CGROUP2).join("tenancy").join(t);
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    if e.file_type().map(|f| f.is_dir()).unwrap_or(false) {
                        v.push(e.path());
                    }
                }
            }
        }
        v.sort();
        v
    }

    pub fn scratch_dir(&self, t: usize, job: u64) -> PathBuf {
        self.root
            .join("scratch")
            .join(&self.tenants[t])
            .join(format!("job_{job}"))
    }

    /// Every job folder left under the scratch root (retained folders excluded).
    pub fn scratch_jobs(&self) -> Vec<PathBuf> {
        let mut v = Vec::new();
        for t in &self.tenants {
            if let Ok(rd) = std::fs::read_dir(self.root.join("scratch").join(t)) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with("job_") {
                        v.push(e.path());
                    }
                }
            }
        }
        v
    }

    /// The shim's state file.
    pub fn shim_state(&self) -> Value {
        match std::fs::read_to_string(self.root.join("shim-state.json")) {
            Ok(t) => serde_json::from_str(&t).unwrap(),
            Err(_) => serde_json::json!({"gpus": []}),
        }
    }

    /// (gpu index, gi id, start, size) of every GPU instance the shim holds.
    pub fn gis(&self) -> Vec<(usize, u64, u64, u64)> {
        let s = self.shim_state();
        let mut out = Vec::new();
        for (i, g) in s["gpus"].as_array().unwrap().iter().enumerate() {
            for gi in g["gis"].as_array().unwrap() {
                out.push((
                    i,
                    gi["id"].as_u64().unwrap(),
                    gi["start"].as_u64().unwrap(),
                    gi["size"].as_u64().unwrap(),
                ));
            }
        }
        out
    }

    pub fn audit_path(&self) -> PathBuf {
        self.config.cluster.audit_log.clone()
    }

    pub fn records(&self) -> Vec<Record> {
        let Ok(text) = std::fs::read_to_string(self.audit_path()) else {
            return vec![];
        };
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad record {l}: {e}")))
            .collect()
    }

    pub fn chain_is_valid(&self) -> bool {
        let r = verify_paths(&[self.audit_path()], &AnchorSet::default(), 10).unwrap();
        if !r.is_clean() {
            eprintln!("verify: {r:?}");
        }
        r.is_clean()
    }

    /// Asserts the node holds nothing of any job of this world.
    pub fn assert_nothing_left(&self, when: &str) {
        assert_eq!(self.gis(), vec![], "{when}: MIG instances left in the shim");
        assert_eq!(
            self.cgroups(),
            Vec::<PathBuf>::new(),
            "{when}: cgroups left"
        );
        assert_eq!(
            self.scratch_jobs(),
            Vec::<PathBuf>::new(),
            "{when}: scratch folders left"
        );
        assert_eq!(
            self.journals(),
            Vec::<String>::new(),
            "{when}: journals left"
        );
        let held: Vec<u64> = self.intent_records().iter().map(|r| r.0).collect();
        assert_eq!(held, Vec::<u64>::new(), "{when}: intent log slots held");
        // The firewall is static per tenant: nothing of a job may be in it.
        let table = self.nft_table();
        assert!(
            !table.contains("job_"),
            "{when}: a job is in the firewall: {table}"
        );
        for t in &self.tenants {
            assert!(
                Path::new(CGROUP2).join("tenancy").join(t).is_dir(),
                "{when}: tenant cgroup {t} removed (its rules would no longer match)"
            );
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Leftover cgroups (a failed test): deepest first.
        for cg in self.cgroups() {
            let _ = std::fs::remove_dir(cg);
        }
        for t in &self.tenants {
            let _ = std::fs::remove_dir(Path::new(CGROUP2).join("tenancy").join(t));
        }
        // The device programs the jobs shared (a test running beside this one loads its own
        // again).
        let _ = std::fs::remove_dir(
            Path::new(CGROUP2)
                .join("tenancy")
                .join(tenancy_devices::job::PROGRAM_KEEPER),
        );
        run_quiet("ip", &["netns", "del", &self.netns]);
        for u in &self.users {
            run_quiet("userdel", &[&u.name]);
        }
        for t in &self.tenants {
            run_quiet("groupdel", &[t]);
        }
    }
}

/// Whether the ELF file at `path` names a program interpreter (PT_INTERP): dynamically linked.
pub fn has_interpreter(path: &Path) -> bool {
    let elf = std::fs::read(path).unwrap();
    assert!(
        elf.starts_with(b"\x7fELF\x02\x01"),
        "{}: not a 64-bit LE ELF",
        path.display()
    );
    let u = |at: usize, n: usize| {
        elf[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |acc, b| acc << 8 | u64::from(*b)) as usize
    };
    let (phoff, phentsize, phnum) = (u(0x20, 8), u(0x36, 2), u(0x38, 2));
    (0..phnum).any(|i| u(phoff + i * phentsize, 4) == 3)
}

/// A folder holding copies of the named product binaries only.
pub fn install(w: &World, dir: &str, names: &[&str]) -> Option<PathBuf> {
    let bin = w.root.join(dir);
    std::fs::create_dir_all(&bin).unwrap();
    for name in names {
        let from = built_or_skip(name)?;
        std::fs::copy(&from, bin.join(name)).unwrap();
    }
    Some(bin)
}

/// A root test's world with `names` installed alone in its `bin` folder; None: skip (not
/// root, no binaries, or `linked` built dynamically, which hands nothing off).
pub fn static_world(names: &[&str], linked: &str) -> Option<(World, PathBuf)> {
    if !requires_root("real users, product cgroups, BPF device programs") {
        return None;
    }
    let w = World::new(1, None)?;
    let bin = install(&w, "bin", names)?;
    if has_interpreter(&bin.join(linked)) {
        // Built with TENANCY_DYNAMIC_PROLOG=1, TENANCY_DYNAMIC_EPILOG=1 or without glibc's
        // archives (tests/tests/binaries.rs says how the binaries must be linked).
        eprintln!("SKIP: this {linked} is dynamically linked");
        return None;
    }
    Some((w, bin))
}

/// A stand-in for tenancy-prolog-dynamic in `bin`: writes its arguments (`args=...`) and its
/// environment to `seen`, and exits with `status`. Returns its path.
pub fn fake_dynamic_build(bin: &Path, seen: &Path, status: u8) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let fake = bin.join("tenancy-prolog-dynamic");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\n{{ echo \"args=$*\"; env; }} > {}\nexit {status}\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake
}
