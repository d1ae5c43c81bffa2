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

use crate::daemons::machine_lock;
use crate::release_root::{merge_users, SlurmRoot};
use crate::slurm_conf::{cgroup_conf, SlurmConf};
use crate::stack::{nvml_fixture, tenancy_toml, StackPaths, Tenants};
use crate::{artifact, Options, Users, World};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The folder in the root that holds a boot's programs, scripts and results (`/<it>` inside the
/// node): one per boot, so that boots of other checkouts on this machine on the same cached root
/// do not take each other's files.
fn boot_dir() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "tenancy-uml-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

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

<<<<<<< HEAD
/// slurm.conf of the node: Slurm's cgroup/v2 with memory accounted per core and job, its files
/// on the node's tmpfs (/tmp/slurm), the product's prolog, epilog and plugstack.
fn slurm_conf(w: &str) -> String {
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
    c.line("NodeName=vm CPUs=4 RealMemory=500 State=UNKNOWN");
    c.line("PartitionName=debug Nodes=vm Default=YES MaxTime=INFINITE State=UP");
    c.render()
=======
/// The node's init (PID 1): file systems, a pure cgroup v2 tree with memory and pids for Slurm,
/// an address for slurmd, munged, Slurm with cgroup/v2, then the scenario; then power off.
/// `PrologFlags=Alloc,Contain` unless `slurm_conf_extra` has a `PrologFlags=` line of its own.
fn init_script(slurm_conf_extra: &str) -> String {
    let prolog_flags = if slurm_conf_extra.lines().any(|l| {
        l.trim_start()
            .to_ascii_lowercase()
            .starts_with("prologflags=")
    }) {
        ""
    } else {
        "PrologFlags=Alloc,Contain"
    };
    // `setup.sh` runs after the configs are written and before the daemons start.
    format!(
        r#"#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
W=/{DIR}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
chmod 1777 /tmp
exec >$W/out/init.log 2>&1
echo "+cpu +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control
hostname vm
ip link set lo up
ip link add d0 type dummy && ip addr add 192.0.2.10/24 dev d0 && ip link set d0 up
grep -q ' vm$' /etc/hosts || echo '192.0.2.10 vm' >>/etc/hosts
mkdir -p /run/munge && chown munge:munge /run/munge
# Logs and seed on tmpfs: hostfs shows files the node writes as the host's root, and munged
# refuses a log it does not own.
runuser -u munge -- munged --force --log-file=/run/munge/munged.log --seed-file=/run/munge/munged.seed
S=/tmp/slurm
mkdir -p $S/state $S/spool $S/jobs && chmod 1777 $S/jobs
cat >$S/slurm.conf <<EOF
ClusterName=uml
SlurmctldHost=vm
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
{prolog_flags}
JobAcctGatherType=jobacct_gather/cgroup
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
DefMemPerCPU=100
KillWait=5
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
{slurm_conf_extra}
NodeName=vm CPUs=4 RealMemory=500 State=UNKNOWN
PartitionName=debug Nodes=vm Default=YES MaxTime=INFINITE State=UP
EOF
cat >$S/cgroup.conf <<EOF
CgroupPlugin=cgroup/v2
CgroupMountpoint=/sys/fs/cgroup
IgnoreSystemd=yes
ConstrainCores=no
ConstrainDevices=yes
ConstrainRAMSpace=yes
EOF
export SLURM_CONF=$S/slurm.conf
sh $W/setup.sh >$W/out/setup.log 2>&1
echo "setup_rc=$?" >>$W/out/results
slurmctld -i
slurmd
# At most 90 s: a client without munge waits for its message timeout each time.
end=$(($(date +%s) + 90))
until timeout 5 sinfo -h -o %t 2>/dev/null | grep -q idle; do
  [ "$(date +%s)" -gt $end ] && break; sleep 0.5
done
state=$(timeout 5 sinfo -h -o %t 2>&1)
echo "node_state=$state" >>$W/out/results
# A node that did not come up runs no scenario: its logs say why.
if [ "$state" = idle ]; then
  sh $W/scenario.sh >$W/out/scenario.log 2>&1
  echo "scenario_rc=$?" >>$W/out/results
fi
cp $S/*.log $W/out/ 2>/dev/null
sync
echo o >/proc/sysrq-trigger
"#
    )
>>>>>>> issue-40-v2
}

/// A pure cgroup v2 node with the product installed as on a real node (scripts/uml/
/// product-setup.sh): Slurm 24.11's root, the UML kernel, tenants acme and globex.
pub struct PureV2Node {
    pub tenants: Tenants,
    root: SlurmRoot,
    kernel: PathBuf,
}

impl World for PureV2Node {
    fn start(_: &Options, users: &mut Users) -> Result<PureV2Node> {
        let tenants = Tenants::create(users)?;
        let root = SlurmRoot::make("24.11").context("Slurm 24.11 root")?;
        let kernel = kernel().context("UML kernel")?;
        Ok(PureV2Node {
            tenants,
            root,
            kernel,
        })
    }
}

impl PureV2Node {
    /// Boots the node and runs `scenario` (a script of scripts/pure_v2/, after
    /// scripts/uml/lib.sh); the node must have come up with the product set up.
    pub fn run(&self, scenario: &str) -> NodeRun {
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
        let t = &self.tenants;
        let dir = boot_dir();
        let files = [
            (
                "init.sh",
                include_str!("../scripts/uml/init.sh").to_string(),
            ),
            ("slurm.conf", slurm_conf(&dir)),
            ("cgroup.conf", cgroup_conf("cgroup/v2")),
            ("fixture.toml", nvml_fixture(&paths)),
            ("tenancy.toml", tenancy_toml(&paths, t).to_string()),
            (
                "setup.sh",
                include_str!("../scripts/uml/product-setup.sh").to_string(),
            ),
            ("lib.sh", include_str!("../scripts/uml/lib.sh").to_string()),
            ("scenario.sh", scenario.to_string()),
            ("a_user", t.acme1.name.clone()),
            ("g_user", t.globex1.name.clone()),
        ];
        // The machine-wide e2e lock, as every cluster here (other checkouts boot on this root).
        let lock = machine_lock().unwrap_or_else(|e| panic!("{e:#}"));
        let run = boot(
            &self.root,
            &dir,
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

/// Boots the node on `root` with `kernel`: `programs` (name, host path) copied into `/DIR/bin`,
/// `files` (name, text) into `/DIR` (init.sh is its PID 1); the folder goes afterwards (unless
/// TENANCY_E2E_KEEP is set).
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
    if std::env::var_os("TENANCY_E2E_KEEP").is_some() {
        eprintln!("tenancy-e2e: keeping {}", w.display());
    } else {
        let _ = fs::remove_dir_all(&w);
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
