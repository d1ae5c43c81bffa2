//! A pure cgroup v2 Slurm node for the e2e tests: a user-mode-linux kernel (scripts/uml-kernel,
//! built with the nf_tables options the firewall needs) booted on a release root
//! (scripts/slurm-root, hostfs) as its own machine, where Slurm's cgroup/v2 plugin owns the
//! jobs' cgroups (`ConstrainDevices=yes`, `ConstrainRAMSpace=yes`). This host is hybrid and its
//! v1 hierarchies are in use: a node of its own is the only way to get a pure v2 tree here.
//!
//! The node runs one scenario, a shell script of scripts/pure_v2/, as root after slurmctld,
//! slurmd and munged are up (scripts/uml/init.sh is its PID 1), then powers off. Everything the
//! product and the jobs write stays on the node's tmpfs (/tmp); the scenario hands its findings
//! back as `key=value` lines in `out/results` of the node's folder in the root (hostfs), with
//! its log beside them.
//!
//! Each boot is on an overlay of its own of the cached root ([`SlurmRoot::fresh`],
//! crates/testing/e2e/src/root_overlay.rs): what it writes there (its users, /etc/hosts, the
//! node's folder) is gone with the overlay, so no boot sees what another left, and boots of
//! other checkouts on this machine do not take each other's files.

use crate::daemons::machine_lock;
use crate::release_root::{merge_users, SlurmRoot};
use crate::slurm_conf::{cgroup_conf, SlurmConf};
use crate::stack::{nvml_fixture, tenancy_toml, StackPaths, Tenants};
use crate::{artifact, ConfigEdit, Options, Users, World};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The folder in the root that holds a boot's programs, scripts and results (`/<it>` inside the
/// node; the boot's overlay is its own).
const BOOT_DIR: &str = "tenancy-uml";

/// What a boot left: the scenario's `key=value` results, its log and the kernel's console.
#[derive(Debug)]
pub struct NodeRun {
    pub results: BTreeMap<String, String>,
    pub log: String,
    pub console: String,
    pub boot_seconds: f64,
}

impl NodeRun {
    /// A result the scenario must have written, or a panic that shows the logs.
    pub fn get(&self, key: &str) -> &str {
        self.results
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| {
                panic!(
                    "the node's scenario wrote no {key}: results {:?}\n--- scenario log\n{}\n--- \
                 console (tail)\n{}",
                    self.results,
                    self.log,
                    tail(&self.console, 60)
                )
            })
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The UML kernel (scripts/uml-kernel: built when missing; fails loudly when it cannot be).
/// TENANCY_UML_KERNEL names another one (a kernel without nf_tables inet cannot load the
/// firewall).
pub fn kernel() -> Result<PathBuf> {
    if let Some(k) = std::env::var_os("TENANCY_UML_KERNEL") {
        return Ok(PathBuf::from(k));
    }
    let repo = crate::repo_root();
    let out = Command::new(repo.join("scripts/uml-kernel"))
        .stderr(Stdio::inherit())
        .output()
        .context("run scripts/uml-kernel")?;
    if !out.status.success() {
        bail!(
            "scripts/uml-kernel failed ({}): see the lines above",
            out.status
        );
    }
    let path = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim(),
    );
    if !path.is_file() {
        bail!("scripts/uml-kernel printed no kernel");
    }
    Ok(path)
}

/// slurm.conf of the node: Slurm's cgroup/v2 with memory accounted per core and job, its files
/// on the node's tmpfs (/tmp/slurm), the product's prolog, epilog and plugstack, then the
/// scenario's own lines (`PrologFlags=Alloc`: a node without Contain).
fn slurm_conf_text(w: &str, extra: &[String]) -> String {
    let mut c = SlurmConf::new("uml", "vm").files_in(Path::new("/tmp/slurm"), false);
    for (k, v) in [
        ("SelectTypeParameters", "CR_Core_Memory"),
        ("JobAcctGatherType", "jobacct_gather/cgroup"),
        // UML has one CPU: the node's CPUs=4 stands.
        ("SlurmdParameters", "config_overrides"),
        ("DefMemPerCPU", "100"),
        ("Prolog", &format!("/{w}/bin/tenancy-prolog")),
        ("Epilog", &format!("/{w}/bin/tenancy-epilog")),
        ("PlugStackConfig", "/tmp/slurm/plugstack.conf"),
    ] {
        c.set(k, v);
    }
    for l in extra {
        c.extra(l);
    }
    c.line("NodeName=vm CPUs=4 RealMemory=500 State=UNKNOWN");
    c.line("PartitionName=debug Nodes=vm Default=YES MaxTime=INFINITE State=UP");
    c.render()
}

/// A pure cgroup v2 node with the product installed as on a real node (scripts/uml/
/// product-setup.sh): Slurm 24.11's root, the UML kernel, tenants acme and globex; the
/// options' slurm.conf lines and config edits apply to every boot.
pub struct PureV2Node {
    pub tenants: Tenants,
    root: SlurmRoot,
    kernel: PathBuf,
    slurm_conf: Vec<String>,
    config: Vec<ConfigEdit>,
}

impl World for PureV2Node {
    fn start(options: &Options, users: &mut Users) -> Result<PureV2Node> {
        let tenants = Tenants::create(users)?;
        let root = SlurmRoot::make("24.11").context("Slurm 24.11 root")?;
        let kernel = kernel().context("UML kernel")?;
        if let Some(why) = host_cannot_run(&kernel)? {
            return Err(crate::scenario::HostCannotRun(why).into());
        }
        Ok(PureV2Node {
            tenants,
            root,
            kernel,
            slurm_conf: options.slurm_conf.clone(),
            config: options.config.clone(),
        })
    }
}

/// Why this host cannot run the UML kernel at all, or None; checked once per test binary by
/// booting it on the host's own root, read-only, with `/bin/true` as init. Linux 6.1's UML
/// hands ptrace an XSTATE buffer sized for AVX (832 bytes), and a host kernel whose XSAVE area
/// is larger (AVX-512, AMX) refuses it: "ptrace set fp regs failed, errno = 14" at the first
/// process, and init dies. (A UML of Linux 6.10+ sizes it from CPUID.)
pub fn host_cannot_run(kernel: &Path) -> Result<Option<String>> {
    static CHECKED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if let Some(r) = CHECKED.get() {
        return Ok(r.clone());
    }
    let out = tempfile::NamedTempFile::new()?;
    let mut child = Command::new(kernel)
        .args([
            "mem=64M",
            "root=/dev/root",
            "rootfstype=hostfs",
            "rootflags=/",
            "ro",
        ])
        .args(["init=/bin/true", "con=null", "con0=fd:0,fd:1"])
        .stdin(Stdio::null())
        .stdout(out.reopen()?)
        .stderr(out.reopen()?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("start {}", kernel.display()))?;
    let t = Instant::now();
    while child.try_wait()?.is_none() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: plain kill(2) of the group this function made for the kernel.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    let console = fs::read_to_string(out.path()).unwrap_or_default();
    let r = console
        .lines()
        .find(|l| l.contains("ptrace set fp regs failed"))
        .map(|l| {
            format!(
                "the UML kernel {} cannot run on this host ({}): its CPU's XSAVE area is larger \
                 than Linux 6.1's UML handles (AVX-512 or AMX); the pure cgroup v2 node needs a \
                 UML kernel of Linux 6.10+ here (docs/known-gaps.md)",
                kernel.display(),
                l.trim()
            )
        });
    Ok(CHECKED.get_or_init(|| r).clone())
}

/// The LD_PRELOAD port rewrite (src/port_rewrite.c), built once per test binary for the
/// node's `$W/bin`.
fn port_rewrite_so() -> Result<PathBuf> {
    static SO: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    if let Some((_, so)) = SO.get() {
        return Ok(so.clone());
    }
    let d = tempfile::tempdir()?;
    let so = crate::steer::port_rewrite_in(d.path())?;
    Ok(SO.get_or_init(|| (d, so)).1.clone())
}

impl PureV2Node {
    /// Boots the node and runs `scenario` (a script of scripts/pure_v2/, after
    /// scripts/uml/lib.sh); the node must have come up with the product set up.
    pub fn run(&self, scenario: &str) -> NodeRun {
        self.run_with(&[], scenario)
    }

    /// [`PureV2Node::run`] with slurm.conf lines of this boot's own after the options' (a
    /// second boot of a scenario on another configuration: `PrologFlags=Alloc`).
    pub fn run_with(&self, slurm_conf: &[&str], scenario: &str) -> NodeRun {
        let paths = StackPaths::under(Path::new("/tmp/tenancy"));
        let bin = |name: &str| (name.to_string(), artifact(name).unwrap());
        let spank = self.root.plugin("libspank_tenancy.so").unwrap();
        let mut programs: Vec<(String, PathBuf)> = [
            "tenancy-prolog",
            "tenancy-epilog",
            "tenancy-prolog-dynamic",
            "tenancyctl",
            "tenancy-e2e-probe",
            "nvml-shim-ctl",
            "libnvidia_ml.so",
        ]
        .into_iter()
        .map(bin)
        .collect();
        programs.push(("libspank_tenancy.so".into(), spank));
        programs.push(("port_rewrite.so".into(), port_rewrite_so().unwrap()));
        let t = &self.tenants;
        let mut conf_lines = self.slurm_conf.clone();
        conf_lines.extend(slurm_conf.iter().map(|l| l.to_string()));
        let mut config = tenancy_toml(&paths, t);
        for edit in &self.config {
            edit(&mut config);
        }
        let files = [
            (
                "init.sh",
                include_str!("../scripts/uml/init.sh").to_string(),
            ),
            ("slurm.conf", slurm_conf_text(BOOT_DIR, &conf_lines)),
            ("cgroup.conf", cgroup_conf("cgroup/v2")),
            ("fixture.toml", nvml_fixture(&paths)),
            ("tenancy.toml", config.to_string()),
            (
                "setup.sh",
                include_str!("../scripts/uml/product-setup.sh").to_string(),
            ),
            ("lib.sh", include_str!("../scripts/uml/lib.sh").to_string()),
            ("scenario.sh", scenario.to_string()),
            ("a_user", t.acme1.name.clone()),
            ("g_user", t.globex1.name.clone()),
        ];
        // A root no other boot has written (its own overlay of the cached one).
        let root = self
            .root
            .fresh()
            .unwrap_or_else(|e| panic!("UML node: an overlay of the 24.11 root: {e:#}"));
        // The machine-wide e2e lock, as every cluster here.
        let lock = machine_lock().unwrap_or_else(|e| panic!("{e:#}"));
        let run = boot(
            &root,
            BOOT_DIR,
            &self.kernel,
            &programs,
            &files,
            Duration::from_secs(900),
        )
        .unwrap_or_else(|e| panic!("UML node: {e:#}"));
        drop(lock);
        eprintln!("UML node up and down in {:.0} s", run.boot_seconds);
        assert_eq!(run.get("setup_rc"), "0", "{}", run.log);
        assert_eq!(run.get("node_state"), "idle", "{}", run.log);
        run
    }
}

/// Boots the node on `root` (an overlay of its own) with `kernel`: `programs` (name, host
/// path) copied into `/DIR/bin`, `files` (name, text) into `/DIR` (init.sh is its PID 1); the
/// folder goes with the overlay (TENANCY_E2E_KEEP: a copy stays in the temp folder).
fn boot(
    root: &SlurmRoot,
    dir: &str,
    kernel: &Path,
    programs: &[(String, PathBuf)],
    files: &[(&str, String)],
    timeout: Duration,
) -> Result<NodeRun> {
    let w = root.dir.join(dir);
    if w.exists() {
        fs::remove_dir_all(&w).with_context(|| format!("remove {}", w.display()))?;
    }
    fs::create_dir_all(w.join("bin"))?;
    fs::create_dir_all(w.join("out"))?;
    for (name, src) in programs {
        let dest = w.join("bin").join(name);
        fs::copy(src, &dest).with_context(|| format!("copy {}", src.display()))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
    }
    fs::set_permissions(&w, fs::Permissions::from_mode(0o755))?;
    fs::set_permissions(w.join("bin"), fs::Permissions::from_mode(0o755))?;
    for (name, text) in files {
        fs::write(w.join(name), text)?;
    }
    fs::set_permissions(w.join("init.sh"), fs::Permissions::from_mode(0o755))?;
    merge_users(&root.dir)?;
    let console_path = w.join("out/console.log");
    let console = fs::File::create(&console_path)?;
    let t = Instant::now();
    let mut child = Command::new(kernel)
        .arg("mem=1G")
        .arg("root=/dev/root")
        .arg("rootfstype=hostfs")
        .arg(format!("rootflags={}", root.dir.display()))
        .arg("rw")
        .arg(format!("init=/{dir}/init.sh"))
        .arg("con=null")
        .arg("con0=fd:0,fd:1")
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .process_group(0)
        .spawn()
        .with_context(|| format!("start {}", kernel.display()))?;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if t.elapsed() > timeout {
            // The kernel's helper processes are in its process group: all of them go.
            // SAFETY: plain kill(2) of the group this test made for the kernel.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let boot_seconds = t.elapsed().as_secs_f64();
    let read = |p: &str| fs::read_to_string(w.join(p)).unwrap_or_default();
    let run = NodeRun {
        results: crate::probe_kv(&read("out/results")),
        log: format!(
            "{}\n--- setup\n{}\n--- init\n{}\n--- slurmd\n{}",
            read("out/scenario.log"),
            read("out/setup.log"),
            read("out/init.log"),
            tail(&read("out/slurmd.log"), 40)
        ),
        console: read("out/console.log"),
        boot_seconds,
    };
    // The folder goes with the boot's overlay: kept, it is copied out first.
    if std::env::var_os("TENANCY_E2E_KEEP").is_some() {
        let keep = tempfile::Builder::new()
            .prefix("tenancy-e2e-uml-")
            .tempdir()?
            .keep();
        let o = Command::new("cp").arg("-a").arg(&w).arg(&keep).output()?;
        eprintln!(
            "tenancy-e2e: keeping {} ({})",
            keep.join(dir).display(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    if status.is_none() {
        bail!(
            "the UML node did not power off within {timeout:?}: results {:?}\n{}\n--- console\n{}",
            run.results,
            run.log,
            tail(&run.console, 60)
        );
    }
    Ok(run)
}
