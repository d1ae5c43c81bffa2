//! A multi-node Slurm cluster on one machine, with the product on every node, for the
//! cross-node isolation tests (tests/multi_node.rs).
//!
//! * Each node is a network, UTS and mount namespace with its own slurmd (scripts/
//!   node-slurmd.sh): its own address (`10.231.0.<i>` on `eth0`, a veth pair into a bridge),
//!   host name (`n<i>`) and a mount namespace that gives it what two slurmd on one host would
//!   otherwise share:
//!   - the cgroup2 hierarchy: `/sys/fs/cgroup/unified` is a bind mount of
//!     `/sys/fs/cgroup/unified/<cluster>/n<i>`, so the product's `tenancy/<tenant>/job_<id>`,
//!     which a multi-node job makes on every node under the same id, is a cgroup of each node's
//!     own. (No cgroup namespace: nft's `socket cgroupv2 level` counts from the hierarchy's
//!     root, and the product finds the bind mount's depth in mountinfo; a cgroup namespace
//!     would hide it.) Slurm's own v1 cgroups are `slurm_n<i>` already;
//!   - the product's state (journals, intent log, audit log, scratch): the config's folder is a
//!     bind mount of the node's own folder;
//!   - /etc/hosts with the node names;
//!   - with [`Options::audit_disk`] (the soak), the audit folder on a file system of the
//!     node's own (src/audit_disk.rs), mounted on the host before the node's namespace is
//!     made: the node's bind of its folder is recursive.
//! * The bridge lives in a network namespace of the test's own, which also runs slurmctld
//!   (`10.231.0.254`) and every client command (sbatch, squeue, ...): nothing of it touches the
//!   host's network or its `inet tenancy` table; each node's table lives in its namespace.
//! * Slurm's own files per node: `SlurmdSpoolDir`, pid and log files carry `%n`.
//! * One cluster at a time: the e2e lock, as [`crate::Cluster`]; the host's Slurm only.
//! * Stop: jobs first (epilogs run), then the daemons by pid, leftovers, the namespaces (their
//!   nft tables go with them), the audit disks (umount, losetup -d), then the cgroups.

use crate::audit_disk::AuditDisk;
use crate::client::{drop_to, enter_namespaces, Client, Entry};
use crate::daemons::{
    cluster_folder, ensure_munge, free_port, hostname_short, kill_leftover_jobs, machine_lock,
    slurm_cgroups, write_file, Daemons,
};
use crate::slurm_conf::{cgroup_conf, with_tenant_groups, SlurmConf};
use crate::stack::Tenants;
use crate::{artifact, slurm_plugin_dir, Options, Slurm, TestUser, Users, World};
use anyhow::{anyhow, bail, Context, Result};
use nix::fcntl::Flock;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tenancy_test_support::collector::{self, Rsyslog};
use tenancy_test_support::TenancyToml;

/// The node network, the controller's address and the tenants' prefixes.
pub const NODE_NETWORK: &str = "10.231.0.0/24";
pub const CTL_ADDR: &str = "10.231.0.254";
pub const ACME_PREFIX: &str = "10.231.1.0/24";
pub const GLOBEX_PREFIX: &str = "10.231.2.0/24";
const SLURMCTLD_PORT: u16 = 6817;
const SLURMD_PORT: u16 = 6818;
/// How long a node [`MultiNode::reboot`]s for.
pub const REBOOT_DOWN: Duration = Duration::from_secs(25);
/// The NVML stand-in's fixture in each node's folder (with [`Options::node_gpus`]); its paths
/// are relative to that folder, so the harness reads the node's state where the node does.
pub const NVML_FIXTURE: &str = "nvml-fixture.toml";

/// One node: `n<i>` at `10.231.0.<i>`.
pub struct Node {
    pub name: String,
    pub index: u32,
    pub netns: String,
    /// The node's own product folder (bind-mounted over the config's).
    pub root: PathBuf,
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

    /// The NVML stand-in's fixture of this node (see [`NVML_FIXTURE`]).
    pub fn nvml_fixture(&self) -> PathBuf {
        self.root.join(NVML_FIXTURE)
    }

    /// The NVML stand-in's state file of this node (its GPUs' instances).
    pub fn nvml_state(&self) -> PathBuf {
        self.root.join("nvml/state.json")
    }
}

/// The NVML stand-in of node `index` (1, 2): `gpus` H200-141GB with MIG mode on, UUIDs of the
/// node's own, the state, device nodes and driver files in the node's folder (paths relative
/// to the fixture's folder, the node's).
pub fn nvml_fixture(index: u32, gpus: usize) -> String {
    let mut f = String::from(
        "state = \"nvml/state.json\"\ndev_dir = \"dev\"\nmig_minors = \"nvml/mig-minors\"\n\
         proc_devices = \"nvml/proc-devices\"\n",
    );
    for g in 0..gpus {
        f.push_str(&format!(
            "\n[[gpus]]\nmodel = \"H200-141GB\"\nuuid = \"GPU-{index:08x}-0000-4000-8000-{g:012x}\"\n\
             mig_mode = true\n"
        ));
    }
    f
}

/// The config's NVML keys for nodes with the stand-in: the library (one copy for all), each
/// node's fixture, driver files and capability nodes at `node_root` (each node's own).
pub fn with_nvml(c: &mut TenancyToml, node_root: &Path, library: &Path) {
    c.cluster()
        .nvml_library(library)
        .nvml_shim_fixture(node_root.join(NVML_FIXTURE));
    c.node()
        .proc_devices(node_root.join("nvml/proc-devices"))
        .mig_minors(node_root.join("nvml/mig-minors"))
        .nvidia_caps_dir(node_root.join("dev/nvidia-caps"));
}

/// Two nodes with the product; its [`Client`] runs in the controller's namespace.
pub struct MultiNode {
    client: Client,
    pub tenancy_toml: PathBuf,
    pub nodes: Vec<Node>,
    pub tenants: Tenants,
    br_ns: String,
    cgroup_base: PathBuf,
    daemons: Daemons,
    /// Per node, the offset of its boot clock after a [`MultiNode::reboot`] (None before).
    boot_offsets: Vec<Option<i64>>,
    /// The audit collector ([`Options::collector`]), in the bridge's namespace.
    pub collector: Option<Rsyslog>,
    /// Per node, its audit file system ([`Options::audit_disk`]; empty without).
    audit_disks: Vec<AuditDisk>,
    /// Why the nodes have no audit disk of their own although [`Options::audit_disk`] asked
    /// for one (no loop device here).
    pub audit_disk_missing: Option<String>,
    /// GPUs each node has through the NVML stand-in ([`Options::node_gpus`]).
    pub gpus: usize,
    stopped: bool,
    _lock: Flock<File>,
}

impl std::ops::Deref for MultiNode {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl World for MultiNode {
    fn start(options: &Options, users: &mut Users) -> Result<MultiNode> {
        MultiNode::start(users, options)
    }
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

fn net_ns(name: &str) -> (PathBuf, libc::c_int) {
    (Path::new("/run/netns").join(name), libc::CLONE_NEWNET)
}

/// The product's config on every node (its folders under `node_root`, the one path each
/// node's own folder is mounted at): tier research, tenants acme and globex with no egress of
/// their own, each with its address prefix, the node network, slurmctld and every slurmd as
/// infrastructure.
pub fn tenancy_toml(node_root: &Path, t: &Tenants) -> TenancyToml {
    let mut c = TenancyToml::new("multi");
    c.cluster()
        .state_dir(node_root.join("state"))
        .audit_log(node_root.join("audit/audit.jsonl"))
        .scratch_root(node_root.join("scratch"));
    c.tier("research").share_node(true).share_gpu(true);
    for (tenant, group, prefix) in [
        ("acme", &t.acme_group, ACME_PREFIX),
        ("globex", &t.globex_group, GLOBEX_PREFIX),
    ] {
        c.tenant(tenant)
            .tier("research")
            .groups([group])
            .accounts([tenant])
            .egress(Vec::<String>::new())
            .address_prefix(prefix);
    }
    // slurmctld (srun in a job talks to it) and every slurmd (srun launches the other nodes'
    // tasks).
    c.network()
        .infrastructure([
            format!("{CTL_ADDR}/32:1-65535/tcp"),
            format!("{NODE_NETWORK}:{SLURMD_PORT}/tcp"),
        ])
        .node_network(NODE_NETWORK);
    c
}

/// A config edit: without `node_network` and the tenants' `address_prefix`, the rules of a
/// cluster that does not tell tenants apart across nodes (for a comparison).
pub fn without_cross_node(c: &mut TenancyToml) {
    c.network().unset("node_network");
    for t in ["acme", "globex"] {
        c.tenant(t).unset("address_prefix");
    }
}

impl MultiNode {
    /// Two nodes with the product (prolog, epilog, SPANK and job_submit plugins, the firewall
    /// applied in each node), tenants acme and globex made under the e2e lock, the config
    /// changed by `options.config`. The host's Slurm only.
    pub fn start(users: &mut Users, options: &Options) -> Result<MultiNode> {
        if let Slurm::Release(r) = &options.slurm {
            bail!("several nodes run on the host's Slurm only, not {r}");
        }
        let lock = machine_lock()?;
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
        let dir = cluster_folder(
            "tenancy-mn-",
            options.folder_in.as_deref(),
            &["etc", "state", "spool", "log", "run", "lib", "jobs", "node"],
        )?;
        let d = dir.path().to_path_buf();
        let br_ns = format!("{tag}br");
        let mut mn = MultiNode {
            client: Client::new(dir, Entry::Namespaces(vec![net_ns(&br_ns)])),
            tenancy_toml: d.join("etc/tenancy.toml"),
            nodes: Vec::new(),
            tenants,
            br_ns,
            cgroup_base: v2.join(&tag),
            daemons: Daemons::default(),
            boot_offsets: Vec::new(),
            collector: None,
            audit_disks: Vec::new(),
            audit_disk_missing: None,
            gpus: options.node_gpus,
            stopped: false,
            _lock: lock,
        };
        mn.network(&tag)?;
        mn.boot_offsets = vec![None; mn.nodes.len()];
        if let Some(mb) = options.audit_disk_mb {
            mn.attach_audit_disks(mb);
        }
        let mut config = tenancy_toml(&d.join("node"), &mn.tenants);
        if options.collector {
            let r = mn.start_collector(&d.join("collector"))?;
            // The forwarder ships the anchors too: each node's own file.
            config
                .cluster()
                .audit_anchor(d.join("node/audit/anchors.log"));
            config
                .audit()
                .collectors([r.collector()])
                .ca_file(d.join("collector/soak-ca.pem"));
            mn.collector = Some(r);
        }
        if mn.gpus > 0 {
            let library = d.join("lib/libnvidia-ml.so.1");
            let shim = artifact("libnvidia_ml.so")?;
            fs::copy(&shim, &library).with_context(|| format!("copy {}", shim.display()))?;
            with_nvml(&mut config, &d.join("node"), &library);
            for i in 0..mn.nodes.len() {
                let n = &mn.nodes[i];
                write_file(&n.nvml_fixture(), &nvml_fixture(n.index, mn.gpus), 0o644)?;
                fs::create_dir_all(n.root.join("nvml"))?;
                mn.shim_ctl(i, &["layout"])?;
            }
        }
        for edit in &options.config {
            edit(&mut config);
        }
        write_file(&mn.tenancy_toml, &config.to_string(), 0o644)?;
        write_file(
            &d.join("lib/net_task.py"),
            include_str!("net_task.py"),
            0o644,
        )?;
        ensure_munge(&mut mn.daemons, None, &d.join("log/munged.log"))?;
        let dbd_port = match &options.accounting {
            Some(_) => Some(free_port()?),
            None => None,
        };
        let conf = mn.slurm_conf(&tag, options, dbd_port)?;
        write_file(&mn.conf, &conf, 0o644)?;
        if let Some(port) = dbd_port {
            // MariaDB and slurmdbd where slurmctld is: the bridge's namespace.
            let ns = [net_ns(&mn.br_ns)];
            let conf = mn.conf.clone();
            crate::accounting::start(
                &mut mn.daemons,
                &d,
                &hostname_short()?,
                &conf,
                &tag,
                port,
                &|c| enter_namespaces(c, &ns),
            )?;
        }
        write_file(
            &d.join("etc/cgroup.conf"),
            &cgroup_conf("autodetect"),
            0o644,
        )?;
        mn.spawn_daemons(&d)?;
        let names: Vec<&str> = mn.nodes.iter().map(|n| n.name.as_str()).collect();
        mn.wait_nodes(&names, &["idle"], Duration::from_secs(40))?;
        mn.apply_firewalls()?;
        if mn.collector.is_some() {
            for i in 0..mn.nodes.len() {
                mn.start_forwarder(i)?;
            }
        }
        Ok(mn)
    }

    /// rsyslog with a certificate for slurmctld's address, listening there in the bridge's
    /// namespace (the nodes reach it as they reach slurmctld).
    fn start_collector(&self, dir: &Path) -> Result<Rsyslog> {
        if collector::rsyslogd().is_none() {
            bail!("the audit collector needs rsyslog and rsyslog-gnutls (scripts/install-deps)");
        }
        fs::create_dir_all(dir)?;
        collector::make_ca(dir, "soak");
        collector::make_cert_for(
            dir,
            "soak",
            "collector",
            "serverAuth",
            &format!("IP:{CTL_ADDR}"),
        );
        Ok(Rsyslog::start_at(
            dir,
            "soak",
            "collector",
            false,
            CTL_ADDR,
            Some(&self.br_ns),
        ))
    }

    /// Starts node `i`'s `tenancyctl audit forward` as tenancy-audit-forward.service does
    /// (again after a reboot killed it).
    pub fn start_forwarder(&mut self, i: usize) -> Result<()> {
        let mut cmd = self.unit_command(i, "tenancy-audit-forward.service")?;
        let log = self.path(&format!("log/forward-{}.out", self.nodes[i].name));
        let name = format!("forward {}", self.nodes[i].name);
        self.daemons.kill(&name);
        self.daemons.spawn(&name, &mut cmd, &log)
    }

    /// The pid of node `i`'s audit forwarder, if it runs.
    pub fn forwarder_pid(&self, i: usize) -> Option<u32> {
        self.daemons
            .pid_of(&format!("forward {}", self.nodes[i].name))
    }

    /// Each node's audit folder on an ext4 of `mb` MB of its own (before the nodes'
    /// namespaces are made); where that cannot be, none, and why in `audit_disk_missing`
    /// (said loudly: the soak then skips its `audit_disk_full` fault).
    fn attach_audit_disks(&mut self, mb: u64) {
        let dir = self.path("disk");
        let mut disks = Vec::new();
        let mut made = fs::create_dir_all(&dir).map_err(anyhow::Error::from);
        for n in &self.nodes {
            if made.is_err() {
                break;
            }
            let image = dir.join(format!("audit-{}.img", n.name));
            match AuditDisk::attach(&image, &n.root.join("audit"), mb) {
                Ok(d) => disks.push(d),
                Err(e) => made = Err(e.context(format!("audit disk of {}", n.name))),
            }
        }
        match made {
            Ok(()) => self.audit_disks = disks,
            Err(e) => {
                // The ones made are taken away again: every node or none.
                drop(disks);
                eprintln!(
                    "tenancy-e2e: WARNING: no audit disk of its own for the nodes ({e:#}); \
                     the audit log stays on the cluster folder's file system and the soak \
                     SKIPS its audit_disk_full fault"
                );
                self.audit_disk_missing = Some(format!("{e:#}"));
            }
        }
    }

    /// Whether each node's audit folder is a file system of its own ([`Options::audit_disk`]).
    pub fn has_audit_disks(&self) -> bool {
        !self.audit_disks.is_empty()
    }

    /// Fills node `i`'s audit file system (every free block taken by a filler file): the
    /// product's records meet ENOSPC until [`Self::free_audit_disk`]. Returns the filler's
    /// bytes.
    pub fn fill_audit_disk(&self, i: usize) -> Result<u64> {
        let d = self
            .audit_disks
            .get(i)
            .ok_or_else(|| anyhow!("node {i} has no audit disk of its own"))?;
        d.fill()
    }

    /// Removes the filler of [`Self::fill_audit_disk`] from node `i`'s audit file system.
    pub fn free_audit_disk(&self, i: usize) -> Result<()> {
        match self.audit_disks.get(i) {
            Some(d) => d.free(),
            None => Ok(()),
        }
    }

    /// slurmctld in the bridge's namespace, and each node: a process holding its namespaces
    /// (its cgroup2 subtree, state and host name, scripts/node-slurmd.sh), and its slurmd.
    fn spawn_daemons(&mut self, d: &Path) -> Result<()> {
        self.start_slurmctld()?;
        for i in 0..self.nodes.len() {
            let n = &self.nodes[i];
            let mut cmd = Command::new("unshare");
            cmd.args(["--uts", "--mount", "--propagation", "private", "--"])
                .args([
                    "sh",
                    "-ec",
                    include_str!("../scripts/node-slurmd.sh"),
                    "node",
                ])
                .arg(&n.name)
                .arg(self.cgroup_base.join(&n.name))
                .arg(&n.root)
                .arg(d.join("node"))
                .arg(d.join("etc/hosts"))
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
            enter_namespaces(&mut cmd, &[net_ns(&n.netns)]);
            let log = d.join(format!("log/node-{}.out", n.name));
            self.daemons
                .spawn(&format!("node {}", n.name), &mut cmd, &log)?;
            self.wait_node_mounts(i)?;
            self.start_slurmd(i)?;
        }
        Ok(())
    }

    /// Starts slurmctld (again after [`Self::kill_slurmctld`]: it recovers its state).
    pub fn start_slurmctld(&mut self) -> Result<()> {
        let mut ctld = Command::new("slurmctld");
        ctld.args(["-D", "-i"]).env("SLURM_CONF", &self.conf);
        enter_namespaces(&mut ctld, &[net_ns(&self.br_ns)]);
        let log = self.path("log/slurmctld.out");
        self.daemons.spawn("slurmctld", &mut ctld, &log)
    }

    /// SIGKILLs slurmctld (a crash; jobs and nodes go on without it).
    pub fn kill_slurmctld(&mut self) -> bool {
        self.daemons.kill("slurmctld")
    }

    /// Starts node `i`'s slurmd in the node's namespaces (again after [`Self::kill_slurmd`]).
    pub fn start_slurmd(&mut self, i: usize) -> Result<()> {
        let mut cmd = match self.boot_offsets[i] {
            // A rebooted node's slurmd in a time namespace whose boot clock starts at the
            // reboot: slurmctld sees the node's new boot time (/proc/uptime, sysinfo) and ends
            // the jobs that ran there before it, as after a real reboot.
            Some(offset) => {
                let mut c = self.node_cmd(i, "unshare");
                c.args(["--time", "--boottime", &offset.to_string(), "--kill-child"]);
                c.arg("slurmd");
                c
            }
            None => self.node_cmd(i, "slurmd"),
        };
        cmd.arg("-D");
        let log = self.path(&format!("log/slurmd-{}.out", self.nodes[i].name));
        let name = format!("slurmd {}", self.nodes[i].name);
        self.daemons.spawn(&name, &mut cmd, &log)
    }

    /// SIGKILLs node `i`'s slurmd (its slurmstepds and jobs go on).
    pub fn kill_slurmd(&mut self, i: usize) -> bool {
        let name = format!("slurmd {}", self.nodes[i].name);
        self.daemons.kill(&name)
    }

    /// A crash of node `i` and its boot: every process of the node killed (slurmd, every
    /// slurmstepd, every job's process), the kernel's state of it gone (its nft table, its
    /// emptied cgroups), then the boot units' commands (`firewall apply`, `reconcile
    /// --apply`, as packaging/systemd orders them before slurmd) and slurmd started again.
    /// What is on disk (journals, audit log, scratch) stays, as on a real node.
    pub fn reboot(&mut self, i: usize) -> Result<()> {
        self.kill_slurmd(i);
        self.daemons
            .kill(&format!("forward {}", self.nodes[i].name));
        self.kill_node_processes(i);
        let mut nft = self.node_cmd(i, "nft");
        nft.args(["delete", "table", "inet", "tenancy"]);
        let _ = nft.output();
        remove_cgroups_below(&self.cgroup_base.join(&self.nodes[i].name));
        if self.gpus > 0 {
            self.reboot_gpus(i)?;
        }
        // Down for as long as a reboot takes: slurmctld ends a batch job its batch host's
        // registration no longer lists once the job was last seen more than BatchStartTimeout
        // + MessageTimeout (10 + 10 s) ago (Slurm's _purge_missing_jobs).
        std::thread::sleep(REBOOT_DOWN);
        let uptime = fs::read_to_string("/proc/uptime")?;
        let up: f64 = uptime
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| anyhow!("/proc/uptime: {uptime:?}"))?;
        self.boot_offsets[i] = Some(2 - up as i64);
        for unit in ["tenancy-firewall.service", "tenancy-reconcile.service"] {
            let o = self.run_unit(i, unit)?;
            // reconcile's exit 1 (something kept: a job Slurm still counts on the node) lets
            // slurmd start, as the unit does; its epilog ends that job.
            if !(o.status.success() || (unit.contains("reconcile") && o.status.code() == Some(1))) {
                bail!(
                    "boot of {}: {unit}: {}{}",
                    self.nodes[i].name,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        if self.collector.is_some() {
            self.start_forwarder(i)?;
        }
        self.start_slurmd(i)
    }

    /// What a reboot does to node `i`'s GPUs, as a driver load at boot finds them: no GPU or
    /// compute instance is left (they live in the driver, not on the GPU), the MIG mode stays
    /// (it is kept on the GPU), and /dev (a devtmpfs) holds none of the capability nodes the
    /// prologs made; the driver's own files are laid out again.
    fn reboot_gpus(&self, i: usize) -> Result<()> {
        self.shim_ctl(i, &["reset"])?;
        let caps = self.nodes[i].root.join("dev/nvidia-caps");
        for e in fs::read_dir(&caps).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !["nvidia-cap1", "nvidia-cap2"].contains(&name.as_str()) {
                let _ = fs::remove_file(e.path());
            }
        }
        self.shim_ctl(i, &["layout"])?;
        Ok(())
    }

    /// Runs `nvml-shim-ctl ARGS` on node `i`'s stand-in state (from the host: the fixture's
    /// paths are the node folder's); its stdout, or an error with its output.
    pub fn shim_ctl(&self, i: usize, args: &[&str]) -> Result<String> {
        let o = Command::new(artifact("nvml-shim-ctl")?)
            .env("NVML_SHIM_FIXTURE", self.nodes[i].nvml_fixture())
            .args(args)
            .output()
            .context("run nvml-shim-ctl")?;
        if !o.status.success() {
            bail!(
                "nvml-shim-ctl {} on {}: {}{}",
                args.join(" "),
                self.nodes[i].name,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).to_string())
    }

    /// Runs on node `i` what the product's systemd unit `unit` (packaging/systemd) runs: its
    /// `ExecStart`, with the tenancyctl built here and this cluster's config.
    pub fn run_unit(&self, i: usize, unit: &str) -> Result<Output> {
        Ok(self.unit_command(i, unit)?.output()?)
    }

    /// The command of [`MultiNode::run_unit`], to be run or spawned.
    pub fn unit_command(&self, i: usize, unit: &str) -> Result<Command> {
        let words = tenancy_test_support::units::unit_exec_start(unit, &artifact("tenancyctl")?)
            .map_err(|e| anyhow!(e))?;
        let mut c = self.node_cmd(i, &words[0]);
        c.arg("--config").arg(&self.tenancy_toml).args(&words[1..]);
        Ok(c)
    }

    /// Pids of node `i`'s processes but the one holding its namespaces: those in its network
    /// namespace, in its cgroup2 subtree and in Slurm's v1 cgroups of it.
    pub fn node_processes(&self, i: usize) -> Vec<i32> {
        let keeper = self.keeper_pid(i);
        let net = fs::read_link(format!("/proc/{keeper}/ns/net")).ok();
        let mut pids = std::collections::BTreeSet::new();
        if let Ok(rd) = fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                if net.is_some() && fs::read_link(e.path().join("ns/net")).ok() == net {
                    pids.insert(pid);
                }
            }
        }
        let mut roots = vec![self.cgroup_base.join(&self.nodes[i].name)];
        roots.extend(slurm_cgroups(
            &self.nodes[i].name,
            &["freezer", "pids", "memory", "cpuset", "devices"],
        ));
        for root in roots {
            pids.extend(cgroup_pids(&root));
        }
        pids.remove(&(keeper as i32));
        pids.into_iter().collect()
    }

    /// SIGKILLs every process of node `i` (see [`Self::node_processes`]) until none is left.
    pub fn kill_node_processes(&self, i: usize) {
        for _ in 0..100 {
            let pids = self.node_processes(i);
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "tenancy-e2e: processes of {} outlived SIGKILL: {:?}",
            self.nodes[i].name,
            self.node_processes(i)
        );
    }

    /// Node `i`'s own cgroup2 tree (its `/sys/fs/cgroup/unified`).
    pub fn node_cgroup(&self, i: usize) -> PathBuf {
        self.cgroup_base.join(&self.nodes[i].name)
    }

    /// Node `i`'s slurmd, when it runs.
    pub fn slurmd_pid(&self, i: usize) -> Option<u32> {
        self.daemons
            .pid_of(&format!("slurmd {}", self.nodes[i].name))
    }

    /// `tenancyctl --config .. ARGS` on node `i`, as root outside every job.
    pub fn tenancyctl(&self, i: usize, args: &[&str]) -> Result<Output> {
        let mut c = self.node_cmd(i, artifact("tenancyctl")?);
        c.arg("--config").arg(&self.tenancy_toml).args(args);
        Ok(c.output()?)
    }

    fn keeper_pid(&self, i: usize) -> u32 {
        let name = format!("node {}", self.nodes[i].name);
        self.daemons
            .pid_of(&name)
            .unwrap_or_else(|| panic!("node {} is not running", self.nodes[i].name))
    }

    /// Waits until node `i`'s holder has made its mounts (its host name is set last but one).
    fn wait_node_mounts(&self, i: usize) -> Result<()> {
        let pid = self.keeper_pid(i);
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "sleep" {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "node {} did not make its mounts; see {}",
            self.nodes[i].name,
            self.path(&format!("log/node-{}.out", self.nodes[i].name))
                .display()
        )
    }

    /// The firewall in each node, before the first job (the prolog refuses without it).
    fn apply_firewalls(&self) -> Result<()> {
        for i in 0..self.nodes.len() {
            let mut c = self.node_cmd(i, artifact("tenancyctl")?);
            c.arg("--config")
                .arg(&self.tenancy_toml)
                .args(["firewall", "apply"]);
            let o = c.output()?;
            if !o.status.success() {
                bail!(
                    "tenancyctl firewall apply on {}: {}{}",
                    self.nodes[i].name,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        Ok(())
    }

    /// The bridge in a namespace of the test's own, one namespace per node with a veth pair
    /// into it, each node's cgroup2 subtree, product folder and spool, and the hosts file.
    fn network(&mut self, tag: &str) -> Result<()> {
        let br = self.br_ns.clone();
        ip(&["netns", "add", &br])?;
        ip(&["-n", &br, "link", "set", "lo", "up"])?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        let ctl = format!("{CTL_ADDR}/24");
        ip(&["-n", &br, "addr", "add", &ctl, "dev", "br0"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        // The controller is a host of the node network that is no node: it reaches the tenant
        // addresses on the segment (ARCHITECTURE.md, what the fabric must do).
        ip(&["-n", &br, "route", "add", "10.231.0.0/16", "dev", "br0"])?;
        fs::create_dir(&self.cgroup_base)?;
        let mut hosts = fs::read_to_string("/etc/hosts").unwrap_or_default();
        for i in 1..=2u32 {
            let node = Node {
                name: format!("n{i}"),
                index: i,
                netns: format!("{tag}n{i}"),
                root: self.path(&format!("node-n{i}")),
            };
            let (ns, veth) = (node.netns.clone(), format!("v{i}"));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "-n", &br, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &br, "link", "set", &veth, "master", "br0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let addr = format!("{}/24", node.addr());
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            fs::create_dir(self.cgroup_base.join(&node.name))?;
            for sub in ["state", "audit", "scratch"] {
                fs::create_dir_all(node.root.join(sub))?;
            }
            fs::set_permissions(&node.root, fs::Permissions::from_mode(0o755))?;
            fs::set_permissions(node.root.join("scratch"), fs::Permissions::from_mode(0o755))?;
            fs::create_dir(self.path("spool").join(&node.name))?;
            hosts.push_str(&format!("{} {}\n", node.addr(), node.name));
            self.nodes.push(node);
        }
        write_file(&self.path("etc/hosts"), &hosts, 0o644)
    }

    /// slurm.conf: the controller at its address in the bridge's namespace, each slurmd's own
    /// files (`%n`), the product's prolog, epilog and plugins (copied into the cluster folder).
    fn slurm_conf(&self, tag: &str, options: &Options, dbd_port: Option<u16>) -> Result<String> {
        let d = self.dir.path();
        let spank = d.join("lib/libspank_tenancy.so");
        fs::copy(artifact("libspank_tenancy.so")?, &spank)?;
        fs::set_permissions(&spank, fs::Permissions::from_mode(0o755))?;
        let plugstack = d.join("etc/plugstack.conf");
        let line = format!(
            "required {} config={}\n",
            spank.display(),
            self.tenancy_toml.display()
        );
        write_file(&plugstack, &line, 0o644)?;
        fs::create_dir(d.join("lib/plugins"))?;
        let js = d.join("lib/plugins/job_submit_tenancy.so");
        fs::copy(artifact("libjob_submit_tenancy.so")?, &js)?;
        fs::set_permissions(&js, fs::Permissions::from_mode(0o755))?;
        let host = hostname_short()?;
        let mut conf = SlurmConf::new(tag, &format!("{host}({CTL_ADDR})"))
            .on_host(SLURMCTLD_PORT, SLURMD_PORT)
            .files_in(d, true);
        conf.set("Prolog", &artifact("tenancy-prolog")?.display().to_string())
            .set("Epilog", &artifact("tenancy-epilog")?.display().to_string())
            .set("PlugStackConfig", &plugstack.display().to_string())
            .set(
                "PluginDir",
                &format!(
                    "{}:{}",
                    slurm_plugin_dir()?.display(),
                    d.join("lib/plugins").display()
                ),
            )
            .set("JobSubmitPlugins", "tenancy");
        let mut gres = String::new();
        if let (Some(a), Some(port)) = (&options.accounting, dbd_port) {
            // slurmdbd listens on every address of the bridge's namespace.
            for line in a.conf_lines(CTL_ADDR, port) {
                let (k, v) = line.split_once('=').expect("Key=Value");
                conf.set(k, v);
            }
            // The GPU types on every node: one gres.conf (next to slurm.conf, where slurmctld
            // and each slurmd read it) with each node's records.
            if !a.gpu_types.is_empty() {
                let mut text = String::new();
                for n in &self.nodes {
                    text.push_str(&a.gres_conf(&n.name, &d.join("gres").join(&n.name))?);
                }
                write_file(&d.join("etc/gres.conf"), &text, 0o644)?;
                gres = a.node_gres();
            }
        }
        for l in &options.slurm_conf {
            conf.extra(&with_tenant_groups(l, &self.tenants));
        }
        let cpus = conf.node_cpus(options.cpus);
        for n in &self.nodes {
            conf.line(format!(
                "NodeName={} NodeAddr={} CPUs={cpus} RealMemory=1000 State=UNKNOWN{gres}",
                n.name,
                n.addr()
            ));
        }
        conf.line("PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP");
        Ok(conf.render())
    }

    /// The task program (src/net_task.py) as the jobs and the node's own processes run it.
    pub fn net_task(&self) -> PathBuf {
        self.path("lib/net_task.py")
    }

    /// A command on node `i` (its network, mount and UTS namespaces: its cgroups, state and
    /// nft table), as root, outside every job.
    pub fn node_cmd(&self, i: usize, program: impl AsRef<OsStr>) -> Command {
        let pid = self.keeper_pid(i);
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .current_dir("/");
        let ns = |k: &str| Path::new("/proc").join(pid.to_string()).join("ns").join(k);
        enter_namespaces(
            &mut c,
            &[
                (ns("net"), libc::CLONE_NEWNET),
                (ns("uts"), libc::CLONE_NEWUTS),
                (ns("mnt"), libc::CLONE_NEWNS),
            ],
        );
        c
    }

    /// [`Self::node_cmd`] as `user`: a process of the user on the node, in no job.
    pub fn node_cmd_as(&self, i: usize, user: &TestUser, program: impl AsRef<OsStr>) -> Command {
        let mut c = self.node_cmd(i, program);
        drop_to(&mut c, user);
        c
    }

    /// `sbatch -N2 --ntasks-per-node=1 --tenant=<tenant>` as `user` of a job whose task on
    /// each node runs `net_task.py ARGS` (scripts/jobs/net-task.sh), `env` in its
    /// environment; returns the job id.
    pub fn sbatch(
        &self,
        user: &TestUser,
        tenant: &str,
        env: &[(&str, String)],
        args: &[&str],
    ) -> Result<u64> {
        let dir = self.user_dir(user);
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let file = dir.join(format!("job{n}.sh"));
        write_file(&file, include_str!("../scripts/jobs/net-task.sh"), 0o755)?;
        nix::unistd::chown(
            &file,
            Some(nix::unistd::Uid::from_raw(user.uid)),
            Some(nix::unistd::Gid::from_raw(user.gid)),
        )?;
        let mut c = self.cmd_as(user, "sbatch");
        c.args(["-N2", "--ntasks-per-node=1", "--no-requeue"])
            .arg(format!("--tenant={tenant}"))
            .arg(format!("--output={}/job-%j.out", dir.display()))
            .arg(&file)
            .arg(self.net_task())
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)));
        let o = c.output()?;
        crate::submitted_id(&o)
    }

    /// Packets node `i` dropped for `tenant` (its nft counter `drop_<tenant>`).
    pub fn drops(&self, i: usize, tenant: &str) -> Result<u64> {
        let mut c = self.node_cmd(i, "nft");
        let counter = format!("drop_{tenant}");
        c.args(["list", "counter", "inet", "tenancy", &counter]);
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
        self.cancel_all(Duration::from_secs(20));
        let r = self.daemons.stop();
        let mut roots = vec![self.cgroup_base.clone()];
        for n in &self.nodes {
            roots.extend(slurm_cgroups(
                &n.name,
                &["freezer", "pids", "memory", "cpuset", "devices"],
            ));
        }
        kill_leftover_jobs(&self.conf, &roots);
        for n in &self.nodes {
            let _ = ip(&["netns", "del", &n.netns]);
        }
        let _ = ip(&["netns", "del", &self.br_ns]);
        // The nodes' mount namespaces went with their processes: the host's mount is the last.
        for mut d in self.audit_disks.drain(..) {
            d.remove();
        }
        remove_cgroups(&self.cgroup_base);
        for n in &self.nodes {
            let v1 = [
                "freezer",
                "pids",
                "memory",
                "cpuset",
                "devices",
                "cpu,cpuacct",
            ];
            for root in slurm_cgroups(&n.name, &v1) {
                if root.exists() {
                    remove_cgroups(&root);
                }
            }
        }
        r
    }
}

/// The pids in every `cgroup.procs` under `root`.
fn cgroup_pids(root: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let procs = fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
        out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        if let Ok(rd) = fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    out
}

/// Removes the cgroups below `root` (not `root`), as a reboot loses them.
fn remove_cgroups_below(root: &Path) {
    if let Ok(rd) = fs::read_dir(root) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroups(&e.path());
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
    }
}
