//! The one slurm.conf and cgroup.conf writer of the test clusters: the single node on the host
//! or in a release root, the multi-node cluster, and the pure cgroup v2 (UML) node.

use crate::Tenants;
use std::path::Path;

/// A slurm.conf: `Key=Value` lines in order; [`SlurmConf::set`] replaces a key where it stands.
pub(crate) struct SlurmConf {
    lines: Vec<String>,
}

impl SlurmConf {
    /// What every test cluster has: munge, cons_tres over cores, Slurm's cgroup proctrack and
    /// task plugins, an extern step per job (`PrologFlags=Alloc,Contain`), no accounting, a node
    /// back in service by itself, the daemons as root.
    pub fn new(cluster: &str, controller: &str) -> SlurmConf {
        let mut c = SlurmConf { lines: Vec::new() };
        for (k, v) in [
            ("ClusterName", cluster),
            ("SlurmctldHost", controller),
            ("SlurmUser", "root"),
            ("SlurmdUser", "root"),
            ("AuthType", "auth/munge"),
            ("CredType", "cred/munge"),
            ("SelectType", "select/cons_tres"),
            ("SelectTypeParameters", "CR_Core"),
            ("ProctrackType", "proctrack/cgroup"),
            ("TaskPlugin", "task/cgroup"),
            ("PrologFlags", "Alloc,Contain"),
            ("JobAcctGatherType", "jobacct_gather/none"),
            ("AccountingStorageType", "accounting_storage/none"),
            ("MpiDefault", "none"),
            ("MailProg", "/bin/true"),
            ("ReturnToService", "2"),
            ("KillWait", "5"),
        ] {
            c.set(k, v);
        }
        c
    }

    /// The host's clusters: their own ports, backfill, short timeouts and the daemons'
    /// debug logs.
    pub fn on_host(mut self, ctld_port: u16, slurmd_port: u16) -> SlurmConf {
        self.set("SlurmctldPort", &ctld_port.to_string());
        self.set("SlurmdPort", &slurmd_port.to_string());
        for (k, v) in [
            ("JobCompType", "jobcomp/none"),
            ("SchedulerType", "sched/backfill"),
            ("SlurmctldTimeout", "30"),
            ("SlurmdTimeout", "30"),
            ("InactiveLimit", "0"),
            ("SlurmctldDebug", "info"),
            ("SlurmdDebug", "debug"),
        ] {
            self.set(k, v);
        }
        self
    }

    /// State, spool, pid and log files under `dir` (its state/, spool/, run/, log/); with
    /// `per_node`, each slurmd's own (`%n`).
    pub fn files_in(mut self, dir: &Path, per_node: bool) -> SlurmConf {
        let p = |s: &str| dir.join(s).display().to_string();
        let n = if per_node { "-%n" } else { "" };
        self.set("StateSaveLocation", &p("state"));
        let spool = if per_node {
            format!("{}/%n", p("spool"))
        } else {
            p("spool")
        };
        self.set("SlurmdSpoolDir", &spool);
        self.set("SlurmctldPidFile", &p("run/slurmctld.pid"));
        self.set("SlurmdPidFile", &p(&format!("run/slurmd{n}.pid")));
        self.set("SlurmctldLogFile", &p("log/slurmctld.log"));
        self.set("SlurmdLogFile", &p(&format!("log/slurmd{n}.log")));
        self
    }

    /// Sets `key` (in place when it is there, else at the end).
    pub fn set(&mut self, key: &str, value: &str) -> &mut SlurmConf {
        let line = format!("{key}={value}");
        let prefix = format!("{key}=");
        match self.lines.iter_mut().find(|l| l.starts_with(&prefix)) {
            Some(l) => *l = line,
            None => self.lines.push(line),
        }
        self
    }

    /// The CPUs each node declares: `want`, else this machine's. More than the machine has
    /// needs `SlurmdParameters=config_overrides` (slurmd refuses to register otherwise), which
    /// is set then.
    pub fn node_cpus(&mut self, want: Option<usize>) -> usize {
        let host = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cpus = want.unwrap_or(host);
        if cpus > host {
            self.set("SlurmdParameters", "config_overrides");
        }
        cpus
    }

    /// A test's own line (`Options::slurm_conf`): `Key=Value` replaces the key where it stands
    /// when the conf has it (`PrologFlags=Alloc`: a cluster without Contain), else goes at the
    /// end. Lines that may come several times (`NodeName=`, `PartitionName=`, `NodeSet=`) always
    /// go at the end.
    pub fn extra(&mut self, line: &str) -> &mut SlurmConf {
        const REPEATED: [&str; 3] = ["NodeName", "PartitionName", "NodeSet"];
        match line.split_once('=') {
            Some((k, v))
                if !REPEATED.iter().any(|r| r.eq_ignore_ascii_case(k))
                    && self.lines.iter().any(|l| l.starts_with(&format!("{k}="))) =>
            {
                self.set(k, v)
            }
            _ => self.line(line),
        }
    }

    /// A line as given (`NodeName=` and `PartitionName=` lines).
    pub fn line(&mut self, line: impl Into<String>) -> &mut SlurmConf {
        self.lines.push(line.into());
        self
    }

    pub fn render(&self) -> String {
        self.lines.join("\n") + "\n"
    }
}

/// A test's own slurm.conf line ([`crate::Options::slurm_conf`]) with `{acme_group}` and
/// `{globex_group}` made the groups of this run's tenants (made by name when the world starts,
/// so unknown when the options are written: `MCSParameters=ondemand,select:{acme_group}`).
pub(crate) fn with_tenant_groups(line: &str, t: &Tenants) -> String {
    line.replace("{acme_group}", &t.acme_group)
        .replace("{globex_group}", &t.globex_group)
}

/// cgroup.conf: `plugin` with nothing constrained (the hybrid host: the product's layers
/// confine the jobs), or, on a pure v2 node, Slurm's cgroup/v2 owning the jobs' tree with
/// devices and memory constrained.
pub(crate) fn cgroup_conf(plugin: &str) -> String {
    if plugin == "cgroup/v2" {
        "CgroupPlugin=cgroup/v2\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemd=yes\n\
         ConstrainCores=no\nConstrainDevices=yes\nConstrainRAMSpace=yes\n"
            .to_string()
    } else {
        format!(
            "CgroupPlugin={plugin}\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_cpus_than_the_machine_has_are_declared_with_config_overrides() {
        let host = std::thread::available_parallelism().unwrap().get();
        let mut c = SlurmConf::new("t", "h");
        assert_eq!(c.node_cpus(None), host);
        assert_eq!(c.node_cpus(Some(host)), host);
        assert!(!c.render().contains("SlurmdParameters"));
        assert_eq!(c.node_cpus(Some(host + 2)), host + 2);
        assert!(c
            .render()
            .lines()
            .any(|l| l == "SlurmdParameters=config_overrides"));
    }
}
