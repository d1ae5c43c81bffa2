//! A pure cgroup v2 Slurm node for the e2e tests: a user-mode-linux kernel (scripts/uml-kernel,
//! built with the nf_tables options the firewall needs) booted on a release root
//! (scripts/slurm-root, hostfs) as its own machine, where Slurm's cgroup/v2 plugin owns the
//! jobs' cgroups (`ConstrainDevices=yes`, `ConstrainRAMSpace=yes`). This host is hybrid and its
//! v1 hierarchies are in use: a node of its own is the only way to get a pure v2 tree here.
//!
//! The node runs one scenario, a shell script, as root after slurmctld, slurmd and munged are
//! up, then powers off. Everything the product and the jobs write stays on the node's tmpfs
//! (/tmp); the scenario hands its findings back as `key=value` lines in `$OUT/results`, on the
//! root's folder (hostfs), with its log beside them.

use crate::release_root::{merge_users, SlurmRoot};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The folder in the root that holds the node's programs, scripts and results (its path
/// inside the node: `/tenancy-uml`).
const DIR: &str = "tenancy-uml";

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

/// The node's init (PID 1): file systems, a pure cgroup v2 tree with memory and pids for Slurm,
/// an address for slurmd, munged, Slurm with cgroup/v2, then the scenario; then power off.
fn init_script(slurm_conf_extra: &str) -> String {
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
PrologFlags=Alloc,Contain
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
}

/// Boots the node on `root` with `kernel`, with `files` (name, host path) copied into
/// `/tenancy-uml/bin`, `slurm_conf_extra` lines in slurm.conf, `setup` run before the daemons
/// start (slurm.conf is /tmp/slurm/slurm.conf), and runs `scenario`.
pub fn boot(
    root: &SlurmRoot,
    kernel: &Path,
    files: &[(&str, PathBuf)],
    slurm_conf_extra: &str,
    setup: &str,
    scenario: &str,
    timeout: Duration,
) -> Result<NodeRun> {
    let w = root.dir.join(DIR);
    if w.exists() {
        fs::remove_dir_all(&w).with_context(|| format!("remove {}", w.display()))?;
    }
    fs::create_dir_all(w.join("bin"))?;
    fs::create_dir_all(w.join("out"))?;
    for (name, src) in files {
        let dest = w.join("bin").join(name);
        fs::copy(src, &dest).with_context(|| format!("copy {}", src.display()))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
    }
    fs::set_permissions(&w, fs::Permissions::from_mode(0o755))?;
    fs::set_permissions(w.join("bin"), fs::Permissions::from_mode(0o755))?;
    fs::write(w.join("init.sh"), init_script(slurm_conf_extra))?;
    fs::set_permissions(w.join("init.sh"), fs::Permissions::from_mode(0o755))?;
    fs::write(w.join("setup.sh"), setup)?;
    fs::write(w.join("scenario.sh"), scenario)?;
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
        .arg(format!("init=/{DIR}/init.sh"))
        .arg("con=null")
        .arg("con0=fd:0,fd:1")
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .with_context(|| format!("start {}", kernel.display()))?;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if t.elapsed() > timeout {
            let _ = child.kill();
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
