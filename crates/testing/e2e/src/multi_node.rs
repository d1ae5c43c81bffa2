//! A multi-node Slurm cluster on one machine, with the product on every node, for the
//! cross-node isolation tests (tests/tests/multi_node.rs).
//!
//! * Each node is a network, UTS and mount namespace with its own slurmd: its own address
//!   (`10.231.0.<i>` on `eth0`, a veth pair into a bridge), host name (`n<i>`) and a mount
//!   namespace that gives it what two slurmd on one host would otherwise share:
//!   - the cgroup2 hierarchy: `/sys/fs/cgroup/unified` is a bind mount of
//!     `/sys/fs/cgroup/unified/<cluster>/n<i>`, so the product's `tenancy/<tenant>/job_<id>`,
//!     which a multi-node job makes on every node under the same id, is a cgroup of each node's
//!     own. (No cgroup namespace: nft's `socket cgroupv2 level` counts from the hierarchy's
//!     root, and the product finds the bind mount's depth in mountinfo; a cgroup namespace
//!     would hide it.) Slurm's own v1 cgroups are `slurm_n<i>` already;
//!   - the product's state (journals, intent log, audit log, scratch): the config's folder is a
//!     bind mount of the node's own folder;
//!   - /etc/hosts with the node names.
//! * The bridge lives in a network namespace of the test's own, which also runs slurmctld
//!   (`10.231.0.254`) and every client command (sbatch, squeue, ...): nothing of it touches the
//!   host's network or its `inet tenancy` table; each node's table lives in its namespace.
//! * Slurm's own files per node: `SlurmdSpoolDir`, pid and log files carry `%n`.
//! * One cluster at a time: the e2e lock (/run/tenancy-e2e.lock), as [`crate::Cluster`].
//! * Stop: jobs first (epilogs run), then the daemons by pid, leftovers, the namespaces (their
//!   nft tables go with them), then the cgroups.

use crate::stack::Tenants;
use crate::{
    artifact, find_files, hostname_short, munge_works, parse_kv, slurm_plugin_dir, spawn_daemon,
    stop_child, write_file, TestUser, Users,
};
use anyhow::{anyhow, bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The node network, the controller's address and the tenants' prefixes.
pub const NODE_NETWORK: &str = "10.231.0.0/24";
pub const CTL_ADDR: &str = "10.231.0.254";
pub const ACME_PREFIX: &str = "10.231.1.0/24";
pub const GLOBEX_PREFIX: &str = "10.231.2.0/24";
const SLURMCTLD_PORT: u16 = 6817;
const SLURMD_PORT: u16 = 6818;

/// One node: `n<i>` at `10.231.0.<i>`.
pub struct Node {
    pub name: String,
    pub index: u32,
    pub netns: String,
    /// The node's own product folder (bind-mounted over the config's).
    pub root: PathBuf,
    slurmd: Option<Child>,
}

impl Node {
    pub fn addr(&self) -> String {
        format!("10.231.0.{}", self.index)
    }

    /// The tenant's address on this node (acme: 10.231.1.i, globex: 10.231.2.i).
    pub fn tenant_addr(&self, tenant: &str) -> String {
        let net = if tenant == "acme" { 1 } else { 2 };
        format!("10.231.{net}.{}", self.index)
    }

    fn pid(&self) -> Result<u32> {
        self.slurmd
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| anyhow!("node {} has no slurmd", self.name))
    }
}

/// Egress lists of the two tenants.
#[derive(Clone, Debug, Default)]
pub struct MultiNodeOptions {
    pub acme_egress: Vec<String>,
    pub globex_egress: Vec<String>,
    /// Without `node_network` and `address_prefix`: today's rules, for a comparison.
    pub without_cross_node: bool,
}

pub struct MultiNode {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    pub tenancy_toml: PathBuf,
    pub nodes: Vec<Node>,
    pub tenants: Tenants,
    br_ns: String,
    cgroup_base: PathBuf,
    daemons: Vec<(String, Child)>,
    stopped: bool,
    _lock: Flock<File>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

pub(crate) fn ip(args: &[&str]) -> Result<()> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .context("run ip (apt-get install iproute2)")?;
    if !o.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

/// `setns` into each namespace file in the child, before exec (and before a drop to a user).
fn enter_namespaces(cmd: &mut Command, fds: Vec<(OwnedFd, libc::c_int)>) {
    // SAFETY: setns is async-signal-safe; the fds are owned by the closure and stay open
    // until exec.
    unsafe {
        cmd.pre_exec(move || {
            for (fd, kind) in &fds {
                if libc::setns(fd.as_raw_fd(), *kind) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

fn drop_to(cmd: &mut Command, user: &TestUser) {
    let (uid, gid, groups) = (user.uid, user.gid, user.gids.clone());
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn open_ns(path: &str) -> Result<OwnedFd> {
    Ok(File::open(path)
        .with_context(|| format!("open {path}"))?
        .into())
}

fn tenancy_toml(node_root: &Path, t: &Tenants, opts: &MultiNodeOptions) -> String {
    let list = |v: &[String]| {
        v.iter()
            .map(|d| format!("\"{d}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (nn, ap, gp) = if opts.without_cross_node {
        (String::new(), String::new(), String::new())
    } else {
        (
            format!("node_network = \"{NODE_NETWORK}\"\n"),
            format!("address_prefix = \"{ACME_PREFIX}\"\n"),
            format!("address_prefix = \"{GLOBEX_PREFIX}\"\n"),
        )
    };
    format!(
        r#"[cluster]
name = "multi"
state_dir = "{root}/state"
audit_log = "{root}/audit/audit.jsonl"
scratch_root = "{root}/scratch"

[tiers.research]
share_node = true
share_gpu = true

[tenants.acme]
tier = "research"
groups = ["{ag}"]
accounts = ["acme"]
egress = [{ae}]
{ap}
[tenants.globex]
tier = "research"
groups = ["{gg}"]
accounts = ["globex"]
egress = [{ge}]
{gp}
[network]
# slurmctld (srun in a job talks to it) and every slurmd (srun launches the other nodes' tasks).
infrastructure = ["{CTL_ADDR}/32:1-65535/tcp", "{NODE_NETWORK}:{SLURMD_PORT}/tcp"]
{nn}"#,
        root = node_root.display(),
        ag = t.acme_group,
        gg = t.globex_group,
        ae = list(&opts.acme_egress),
        ge = list(&opts.globex_egress),
    )
}

impl MultiNode {
    /// Two nodes with the product (prolog, epilog, SPANK and job_submit plugins, the firewall
    /// applied in each node), tenants acme and globex.
    /// The tenants' users and groups are made under the e2e lock (unique names: tests of one
    /// binary run side by side).
    pub fn start(users: &mut Users, opts: MultiNodeOptions) -> Result<MultiNode> {
        fs::create_dir_all("/run")?;
        let lock_file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/run/tenancy-e2e.lock")?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow!("flock /run/tenancy-e2e.lock: {e}"))?;
        let tenants = Tenants::create(users)?;
        let v2 = tenancy_devices::CgroupLayout::detect()
            .map_err(|e| anyhow!("cgroup layout: {e}"))?
            .v2_root
            .ok_or_else(|| anyhow!("no cgroup2 hierarchy"))?;
        if v2 != Path::new("/sys/fs/cgroup/unified") {
            bail!("the multi-node cluster needs a hybrid host (cgroup2 at /sys/fs/cgroup/unified), not {}", v2.display());
        }
        let tag = format!(
            "tnmn{}x{}",
            std::process::id() % 100_000,
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let dir = tempfile::Builder::new()
            .prefix("tenancy-mn-")
            .tempdir()
            .context("temp dir")?;
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
        let d = dir.path().to_path_buf();
        for sub in ["etc", "state", "spool", "log", "run", "lib", "jobs", "node"] {
            fs::create_dir(d.join(sub))?;
        }
        fs::set_permissions(d.join("jobs"), fs::Permissions::from_mode(0o1777))?;
        let mut mn = MultiNode {
            conf: d.join("etc/slurm.conf"),
            tenancy_toml: d.join("etc/tenancy.toml"),
            dir,
            nodes: Vec::new(),
            tenants,
            br_ns: format!("{tag}br"),
            cgroup_base: v2.join(&tag),
            daemons: Vec::new(),
            stopped: false,
            _lock: lock,
        };
        // The network: a bridge in a namespace of the test's own, one veth pair per node.
        ip(&["netns", "add", &mn.br_ns])?;
        let br = mn.br_ns.clone();
        ip(&["-n", &br, "link", "set", "lo", "up"])?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            &br,
            "addr",
            "add",
            &format!("{CTL_ADDR}/24"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        // The controller is a host of the node network that is no node: it reaches the tenant
        // addresses on the segment (ARCHITECTURE.md, what the fabric must do).
        ip(&["-n", &br, "route", "add", "10.231.0.0/16", "dev", "br0"])?;
        fs::create_dir(&mn.cgroup_base)?;
        let mut hosts = fs::read_to_string("/etc/hosts").unwrap_or_default();
        for i in 1..=2u32 {
            let node = Node {
                name: format!("n{i}"),
                index: i,
                netns: format!("{tag}n{i}"),
                root: d.join(format!("node-n{i}")),
                slurmd: None,
            };
            ip(&["netns", "add", &node.netns])?;
            ip(&[
                "-n",
                &br,
                "link",
                "add",
                &format!("v{i}"),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &node.netns,
            ])?;
            ip(&[
                "-n",
                &br,
                "link",
                "set",
                &format!("v{i}"),
                "master",
                "br0",
                "up",
            ])?;
            ip(&["-n", &node.netns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                &node.netns,
                "addr",
                "add",
                &format!("{}/24", node.addr()),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &node.netns, "link", "set", "eth0", "up"])?;
            fs::create_dir(mn.cgroup_base.join(&node.name))?;
            for sub in ["state", "audit", "scratch"] {
                fs::create_dir_all(node.root.join(sub))?;
            }
            fs::set_permissions(&node.root, fs::Permissions::from_mode(0o755))?;
            fs::set_permissions(node.root.join("scratch"), fs::Permissions::from_mode(0o755))?;
            fs::create_dir(d.join("spool").join(&node.name))?;
            hosts.push_str(&format!("{} {}\n", node.addr(), node.name));
            mn.nodes.push(node);
        }
        write_file(&d.join("etc/hosts"), &hosts, 0o644)?;
        write_file(
            &mn.tenancy_toml,
            &tenancy_toml(&d.join("node"), &mn.tenants, &opts),
            0o644,
        )?;
        write_file(
            &d.join("lib/net_task.py"),
            include_str!("net_task.py"),
            0o644,
        )?;

        // munge: the host's if it answers (its socket is a file: every namespace reaches it).
        if !munge_works(None) {
            fs::create_dir_all("/run/munge")?;
            let munge = nix::unistd::User::from_name("munge")?
                .ok_or_else(|| anyhow!("no user munge: apt-get install munge"))?;
            nix::unistd::chown("/run/munge", Some(munge.uid), Some(munge.gid))?;
            let mut cmd = Command::new("munged");
            cmd.arg("--foreground")
                .uid(munge.uid.as_raw())
                .gid(munge.gid.as_raw());
            let child = spawn_daemon("munged", &mut cmd, &d.join("log/munged.log"))?;
            mn.daemons.push(("munged".into(), child));
            let t = Instant::now();
            while !munge_works(None) {
                if t.elapsed() > Duration::from_secs(10) {
                    bail!("munged did not answer within 10 s");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }

        // Slurm.
        let host = hostname_short()?;
        let p = |s: &str| d.join(s).display().to_string();
        let spank = d.join("lib/libspank_tenancy.so");
        fs::copy(artifact("libspank_tenancy.so")?, &spank)?;
        fs::set_permissions(&spank, fs::Permissions::from_mode(0o755))?;
        write_file(
            &d.join("etc/plugstack.conf"),
            &format!(
                "required {} config={}\n",
                spank.display(),
                mn.tenancy_toml.display()
            ),
            0o644,
        )?;
        fs::create_dir(d.join("lib/plugins"))?;
        let js = d.join("lib/plugins/job_submit_tenancy.so");
        fs::copy(artifact("libjob_submit_tenancy.so")?, &js)?;
        fs::set_permissions(&js, fs::Permissions::from_mode(0o755))?;
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let mut conf = vec![
            format!("ClusterName={tag}"),
            format!("SlurmctldHost={host}({CTL_ADDR})"),
            format!("SlurmctldPort={SLURMCTLD_PORT}"),
            format!("SlurmdPort={SLURMD_PORT}"),
            "SlurmUser=root".into(),
            "SlurmdUser=root".into(),
            "AuthType=auth/munge".into(),
            "CredType=cred/munge".into(),
            "SelectType=select/cons_tres".into(),
            "SelectTypeParameters=CR_Core".into(),
            "ProctrackType=proctrack/cgroup".into(),
            "TaskPlugin=task/cgroup".into(),
            "PrologFlags=Alloc,Contain".into(),
            "JobAcctGatherType=jobacct_gather/none".into(),
            "JobCompType=jobcomp/none".into(),
            "AccountingStorageType=accounting_storage/none".into(),
            "MpiDefault=none".into(),
            "MailProg=/bin/true".into(),
            "ReturnToService=2".into(),
            "SchedulerType=sched/backfill".into(),
            "SlurmctldTimeout=30".into(),
            "SlurmdTimeout=30".into(),
            "InactiveLimit=0".into(),
            "KillWait=5".into(),
            "SlurmctldDebug=info".into(),
            "SlurmdDebug=debug".into(),
            format!("StateSaveLocation={}", p("state")),
            format!("SlurmdSpoolDir={}/%n", p("spool")),
            format!("SlurmctldPidFile={}", p("run/slurmctld.pid")),
            format!("SlurmdPidFile={}/slurmd-%n.pid", p("run")),
            format!("SlurmctldLogFile={}", p("log/slurmctld.log")),
            format!("SlurmdLogFile={}/slurmd-%n.log", p("log")),
            format!("Prolog={}", artifact("tenancy-prolog")?.display()),
            format!("Epilog={}", artifact("tenancy-epilog")?.display()),
            format!("PlugStackConfig={}", p("etc/plugstack.conf")),
            format!(
                "PluginDir={}:{}",
                slurm_plugin_dir()?.display(),
                p("lib/plugins")
            ),
            "JobSubmitPlugins=tenancy".into(),
        ];
        for n in &mn.nodes {
            conf.push(format!(
                "NodeName={} NodeAddr={} CPUs={cpus} RealMemory=1000 State=UNKNOWN",
                n.name,
                n.addr()
            ));
        }
        conf.push("PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP".into());
        write_file(&mn.conf, &(conf.join("\n") + "\n"), 0o644)?;
        write_file(
            &d.join("etc/cgroup.conf"),
            "CgroupPlugin=autodetect\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n",
            0o644,
        )?;

        let mut ctld = Command::new("slurmctld");
        ctld.args(["-D", "-i"]).env("SLURM_CONF", &mn.conf);
        enter_namespaces(
            &mut ctld,
            vec![(open_ns(&format!("/run/netns/{br}"))?, libc::CLONE_NEWNET)],
        );
        let c = spawn_daemon("slurmctld", &mut ctld, &d.join("log/slurmctld.out"))?;
        mn.daemons.push(("slurmctld".into(), c));

        // Each slurmd in its node's namespaces, with its own cgroup2 subtree and state.
        for i in 0..mn.nodes.len() {
            let n = &mn.nodes[i];
            let mut cmd = Command::new("unshare");
            cmd.args([
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-ec",
            ])
            .arg(
                "hostname \"$1\"; mount --bind \"$2\" /sys/fs/cgroup/unified; \
                     mount --bind \"$3\" \"$4\"; mount --bind \"$5\" /etc/hosts; exec slurmd -D",
            )
            .arg("node")
            .arg(&n.name)
            .arg(mn.cgroup_base.join(&n.name))
            .arg(&n.root)
            .arg(d.join("node"))
            .arg(d.join("etc/hosts"))
            .env("SLURM_CONF", &mn.conf)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
            enter_namespaces(
                &mut cmd,
                vec![(
                    open_ns(&format!("/run/netns/{}", n.netns))?,
                    libc::CLONE_NEWNET,
                )],
            );
            let child = spawn_daemon(
                &format!("slurmd {}", n.name),
                &mut cmd,
                &d.join(format!("log/slurmd-{}.out", n.name)),
            )?;
            mn.nodes[i].slurmd = Some(child);
        }
        mn.wait_nodes_idle(Duration::from_secs(40))?;
        // The firewall in each node, before the first job (the prolog refuses without it).
        for i in 0..mn.nodes.len() {
            let mut c = mn.node_cmd(i, artifact("tenancyctl")?)?;
            c.arg("--config")
                .arg(&mn.tenancy_toml)
                .args(["firewall", "apply"]);
            let o = c.output()?;
            if !o.status.success() {
                bail!(
                    "tenancyctl firewall apply on {}: {}{}",
                    mn.nodes[i].name,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        Ok(mn)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The task program (tests/src/net_task.py) as the jobs run it.
    pub fn net_task(&self) -> String {
        format!(
            "/usr/bin/python3 {}",
            self.path("lib/net_task.py").display()
        )
    }

    /// A client command as root, in the controller's network namespace.
    pub fn cmd(&self, program: impl AsRef<OsStr>) -> Result<Command> {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .current_dir(self.dir.path());
        enter_namespaces(
            &mut c,
            vec![(
                open_ns(&format!("/run/netns/{}", self.br_ns))?,
                libc::CLONE_NEWNET,
            )],
        );
        Ok(c)
    }

    /// A client command run as `user`, in the controller's namespace, cwd its job folder.
    pub fn cmd_as(&self, user: &TestUser, program: impl AsRef<OsStr>) -> Result<Command> {
        let mut c = self.cmd(program)?;
        let home = self.user_dir(user);
        c.env("HOME", &home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name)
            .current_dir(&home);
        drop_to(&mut c, user);
        Ok(c)
    }

    /// A command on node `i` (its network, mount and UTS namespaces: its cgroups, state and
    /// nft table), as root, outside every job.
    pub fn node_cmd(&self, i: usize, program: impl AsRef<OsStr>) -> Result<Command> {
        let pid = self.nodes[i].pid()?;
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .current_dir("/");
        let ns = |k: &str| open_ns(&format!("/proc/{pid}/ns/{k}"));
        enter_namespaces(
            &mut c,
            vec![
                (ns("net")?, libc::CLONE_NEWNET),
                (ns("uts")?, libc::CLONE_NEWUTS),
                (ns("mnt")?, libc::CLONE_NEWNS),
            ],
        );
        Ok(c)
    }

    /// [`Self::node_cmd`] as `user`: a process of the user on the node, in no job.
    pub fn node_cmd_as(
        &self,
        i: usize,
        user: &TestUser,
        program: impl AsRef<OsStr>,
    ) -> Result<Command> {
        let mut c = self.node_cmd(i, program)?;
        drop_to(&mut c, user);
        Ok(c)
    }

    /// The user's own folder (created on demand, owned by the user), shared by every node.
    pub fn user_dir(&self, user: &TestUser) -> PathBuf {
        let p = self.path("jobs").join(&user.name);
        if !p.exists() {
            let _ = fs::create_dir(&p);
            let _ = nix::unistd::chown(
                &p,
                Some(nix::unistd::Uid::from_raw(user.uid)),
                Some(nix::unistd::Gid::from_raw(user.gid)),
            );
            let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o755));
        }
        p
    }

    /// `sbatch -N2 --ntasks-per-node=1 --tenant=<tenant>` of `script` (a shell script's body)
    /// as `user`; returns the job id.
    pub fn sbatch(&self, user: &TestUser, tenant: &str, script: &str) -> Result<u64> {
        let dir = self.user_dir(user);
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let file = dir.join(format!("job{n}.sh"));
        write_file(&file, &format!("#!/bin/sh\n{script}\n"), 0o755)?;
        nix::unistd::chown(
            &file,
            Some(nix::unistd::Uid::from_raw(user.uid)),
            Some(nix::unistd::Gid::from_raw(user.gid)),
        )?;
        let mut c = self.cmd_as(user, "sbatch")?;
        c.args(["-N2", "--ntasks-per-node=1", "--no-requeue"])
            .arg(format!("--tenant={tenant}"))
            .arg(format!("--output={}/job-%j.out", dir.display()))
            .arg(&file);
        let o = c.output()?;
        crate::submitted_id(&o)
    }

    pub fn job_info(&self, id: u64) -> Result<BTreeMap<String, String>> {
        let mut c = self.cmd("scontrol")?;
        c.args(["show", "job", "-o", &id.to_string()]);
        let out = c.output()?;
        if !out.status.success() {
            bail!(
                "scontrol show job {id}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(parse_kv(&String::from_utf8_lossy(&out.stdout)))
    }

    pub fn wait_job(
        &self,
        id: u64,
        states: &[&str],
        timeout: Duration,
    ) -> Result<BTreeMap<String, String>> {
        let t = Instant::now();
        loop {
            let info = self.job_info(id)?;
            let st = info.get("JobState").cloned().unwrap_or_default();
            if states.iter().any(|s| *s == st) {
                return Ok(info);
            }
            if t.elapsed() > timeout {
                bail!(
                    "job {id} is {st} after {timeout:?}, wanted {states:?}: {info:?}; logs in {}",
                    self.path("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn wait_job_done(&self, id: u64, timeout: Duration) -> Result<BTreeMap<String, String>> {
        self.wait_job(
            id,
            &["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"],
            timeout,
        )
    }

    fn wait_nodes_idle(&self, timeout: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            let mut c = self.cmd("sinfo")?;
            c.args(["-h", "-N", "-o", "%N %t"]);
            let o = c.output()?;
            let text = String::from_utf8_lossy(&o.stdout).to_string();
            let idle = text.lines().filter(|l| l.ends_with(" idle")).count();
            if idle == self.nodes.len() {
                return Ok(());
            }
            if t.elapsed() > timeout {
                bail!(
                    "nodes not idle after {timeout:?}: {text:?}; logs in {}",
                    self.path("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until `path` holds a line starting with `prefix`; returns the file's text.
    pub fn wait_file_line(&self, path: &Path, prefix: &str, timeout: Duration) -> Result<String> {
        let t = Instant::now();
        loop {
            let text = fs::read_to_string(path).unwrap_or_default();
            if text.lines().any(|l| l.starts_with(prefix)) {
                return Ok(text);
            }
            if t.elapsed() > timeout {
                bail!(
                    "{} has no line {prefix:?} after {timeout:?}: {text:?}; logs in {}",
                    path.display(),
                    self.path("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Packets node `i` dropped for `tenant` (its nft counter `drop_<tenant>`).
    pub fn drops(&self, i: usize, tenant: &str) -> Result<u64> {
        let mut c = self.node_cmd(i, "nft")?;
        c.args([
            "list",
            "counter",
            "inet",
            "tenancy",
            &format!("drop_{tenant}"),
        ]);
        let o: Output = c.output()?;
        let text = String::from_utf8_lossy(&o.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("no drop counter of {tenant} on node {i}: {text}"))
    }

    /// Stops everything, in order (see the module's comment). Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        if let Ok(mut c) = self.cmd("scancel") {
            c.args(["--full", "--partition", "debug"]);
            let _ = c.output();
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            let Ok(mut q) = self.cmd("squeue") else { break };
            q.args(["-h", "-o", "%i"]);
            match q.output() {
                Ok(o) if o.status.success() && o.stdout.iter().all(|b| b.is_ascii_whitespace()) => {
                    break
                }
                Ok(_) => {}
                Err(_) => break,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut errors = Vec::new();
        for n in &mut self.nodes {
            if let Some(mut c) = n.slurmd.take() {
                if let Err(e) = stop_child(&mut c) {
                    errors.push(format!("slurmd {}: {e}", n.name));
                }
            }
        }
        while let Some((name, mut child)) = self.daemons.pop() {
            if let Err(e) = stop_child(&mut child) {
                errors.push(format!("{name} (pid {}): {e}", child.id()));
            }
        }
        self.kill_leftovers();
        for n in &self.nodes {
            let _ = ip(&["netns", "del", &n.netns]);
        }
        let _ = ip(&["netns", "del", &self.br_ns]);
        remove_cgroups(&self.cgroup_base);
        for n in &self.nodes {
            for ctrl in [
                "freezer",
                "pids",
                "memory",
                "cpuset",
                "devices",
                "cpu,cpuacct",
            ] {
                let root = Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(format!("slurm_{}", n.name));
                if root.exists() {
                    remove_cgroups(&root);
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("stopping daemons: {}", errors.join("; "))
        }
    }

    fn kill_leftovers(&self) {
        let marker = format!("SLURM_CONF={}", self.conf.display());
        if let Ok(rd) = fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
                if !cmd.starts_with(b"slurmstepd") {
                    continue;
                }
                let env = fs::read(e.path().join("environ")).unwrap_or_default();
                if env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
        let mut roots: Vec<PathBuf> = vec![self.cgroup_base.clone()];
        for n in &self.nodes {
            for ctrl in ["freezer", "pids", "memory", "cpuset", "devices"] {
                roots.push(
                    Path::new("/sys/fs/cgroup")
                        .join(ctrl)
                        .join(format!("slurm_{}", n.name)),
                );
            }
        }
        for root in roots {
            for procs in find_files(&root, "cgroup.procs") {
                for pid in fs::read_to_string(&procs).unwrap_or_default().lines() {
                    if let Ok(pid) = pid.trim().parse::<i32>() {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
            }
        }
    }
}

/// Removes a cgroup tree, deepest first (after its processes are gone).
fn remove_cgroups(root: &Path) {
    let mut dirs = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        dirs.push(d);
    }
    for _ in 0..50 {
        for d in dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
        if !root.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("tenancy-e2e: could not remove {}", root.display());
}

impl Drop for MultiNode {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("tenancy-e2e: {e}");
        }
        if std::env::var_os("TENANCY_E2E_KEEP").is_some() {
            let d = std::mem::replace(&mut self.dir, tempfile::TempDir::new().expect("tmp"));
            eprintln!("tenancy-e2e: keeping {}", d.path().display());
            let _ = d.keep();
        }
    }
}
