//! Slurm's own accounting for the e2e cluster: a MariaDB server (Debian's `mariadb-server`)
//! with its data in the cluster's folder, and `slurmdbd` over it; the MIG profiles become typed
//! GPU GRES (count only, no device files) listed in `AccountingStorageTRES`, so `sacct` reports
//! each job's `gres/gpu:<profile>` as slurmctld accounted it. Both daemons are started by the
//! harness and stopped by pid with the cluster.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemons::{free_port, write_file, Daemons};

/// What the cluster's accounting holds: the node's MIG slots as typed GPU GRES.
#[derive(Debug, Clone, Default)]
pub struct Accounting {
    /// (MIG profile, slots on the node), e.g. ("1g.18gb", 7).
    pub gpu_types: Vec<(String, u32)>,
}

impl Accounting {
    /// slurm.conf lines (besides the node's `Gres=`, see [`Self::node_gres`]).
    pub(crate) fn conf_lines(&self, node: &str, dbd_port: u16) -> Vec<String> {
        let mut tres = vec!["gres/gpu".to_string()];
        tres.extend(self.gpu_types.iter().map(|(p, _)| format!("gres/gpu:{p}")));
        vec![
            "AccountingStorageType=accounting_storage/slurmdbd".into(),
            format!("AccountingStorageHost={node}"),
            format!("AccountingStoragePort={dbd_port}"),
            format!("AccountingStorageTRES={}", tres.join(",")),
            "GresTypes=gpu".into(),
        ]
    }

    /// ` Gres=gpu:1g.18gb:7,...` for the NodeName line (empty without types).
    pub(crate) fn node_gres(&self) -> String {
        if self.gpu_types.is_empty() {
            return String::new();
        }
        let g: Vec<String> = self
            .gpu_types
            .iter()
            .map(|(p, n)| format!("gpu:{p}:{n}"))
            .collect();
        format!(" Gres={}", g.join(","))
    }

    /// gres.conf: one record per slot, typed by its profile. Slurm keeps a GPU only with a
    /// `File=`: each slot gets an empty placeholder file in `dir` (ConstrainDevices is off; the
    /// product's devices layer is what confines the job).
    pub(crate) fn gres_conf(&self, node: &str, dir: &Path) -> Result<String> {
        std::fs::create_dir_all(dir)?;
        let mut out = format!("NodeName={node} AutoDetect=off\n");
        let mut i = 0;
        for (p, n) in &self.gpu_types {
            for _ in 0..*n {
                let f = dir.join(format!("slot{i}"));
                std::fs::write(&f, "")?;
                out.push_str(&format!(
                    "NodeName={node} Name=gpu Type={p} File={}\n",
                    f.display()
                ));
                i += 1;
            }
        }
        Ok(out)
    }
}

/// Starts MariaDB (data under `dir/db`, on 127.0.0.1 at a free port) and slurmdbd (its config
/// `slurmdbd.conf` next to `slurm_conf`, where slurmdbd looks for it), and registers
/// `cluster_name`. Each daemon goes into `daemons` as soon as it runs (the cluster stops them
/// by pid, also when a later step fails). `enter` puts each command where slurmctld is (the
/// multi-node cluster's bridge namespace; nothing for the host's).
pub(crate) fn start(
    daemons: &mut Daemons,
    dir: &Path,
    node: &str,
    slurm_conf: &Path,
    cluster_name: &str,
    dbd_port: u16,
    enter: &dyn Fn(&mut Command),
) -> Result<()> {
    let data = dir.join("db/data");
    std::fs::create_dir_all(&data)?;
    let o = Command::new("mariadb-install-db")
        .args([
            "--no-defaults",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ])
        .arg(format!("--datadir={}", data.display()))
        .output()
        .context("mariadb-install-db (apt-get install mariadb-server)")?;
    if !o.status.success() {
        bail!(
            "mariadb-install-db: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let db_port = free_port()?;
    let mut db = Command::new("mariadbd");
    db.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--socket={}", dir.join("db/mysqld.sock").display()))
        .arg(format!(
            "--pid-file={}",
            dir.join("db/mysqld.pid").display()
        ))
        .arg(format!("--port={db_port}"))
        // Only this machine, only the test: slurmdbd connects over TCP without a password.
        .args([
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            "--user=root",
            "--innodb-buffer-pool-size=64M",
            "--innodb-lock-wait-timeout=900",
        ]);
    enter(&mut db);
    daemons.spawn("mariadbd", &mut db, &dir.join("log/mariadbd.log"))?;
    // Its socket file, which answers from any network namespace, once it listens on both.
    let t = Instant::now();
    let socket = dir.join("db/mysqld.sock");
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if t.elapsed() > Duration::from_secs(60) {
            bail!(
                "MariaDB did not listen on {} within 60 s; see {}",
                socket.display(),
                dir.join("log/mariadbd.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let dbd_conf = slurm_conf.with_file_name("slurmdbd.conf");
    write_file(
        &dbd_conf,
        &format!(
            "AuthType=auth/munge\nDbdHost={node}\nDbdPort={dbd_port}\nSlurmUser=root\n\
             StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={db_port}\n\
             StorageUser=root\nStorageLoc=slurm_acct\nPidFile={}\nLogFile={}\nDebugLevel=info\n",
            dir.join("run/slurmdbd.pid").display(),
            dir.join("log/slurmdbd.log").display(),
        ),
        0o600,
    )?;
    let mut dbd = Command::new("slurmdbd");
    dbd.arg("-D").env("SLURM_CONF", slurm_conf);
    enter(&mut dbd);
    daemons.spawn("slurmdbd", &mut dbd, &dir.join("log/slurmdbd.out"))?;
    // Registered before slurmctld starts, so its first connection is accepted; sacctmgr
    // answers once slurmdbd has made its tables.
    let t = Instant::now();
    loop {
        let mut add = Command::new("sacctmgr");
        add.args(["-i", "add", "cluster", cluster_name])
            .env("SLURM_CONF", slurm_conf)
            .stdin(Stdio::null());
        enter(&mut add);
        let o = add.output().context("sacctmgr")?;
        let out =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        if o.status.success() || out.contains("already exists") {
            break;
        }
        if t.elapsed() > Duration::from_secs(90) {
            bail!(
                "sacctmgr add cluster {cluster_name}: {out}; see {}",
                dir.join("log/slurmdbd.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}
