//! Shared by tenancyctl's integration tests.

#![allow(dead_code)] // each test binary uses some of these

#[allow(unused_imports)] // each test binary uses some of these
pub use tenancy_test_support::collector;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use tenancy_audit_log::{Event, Outcome, Record};
use tenancy_test_support::TenancyToml;

pub use tenancy_test_support::printed;

/// A command's status and everything it printed, for assertion messages.
pub fn text(o: &Output) -> String {
    format!("status {:?}\n{}", o.status.code(), printed(o))
}

/// `tenancyctl --config CONFIG ARGS...` (TENANCY_CONFIG unset), run to its end.
pub fn tenancyctl(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("TENANCY_CONFIG")
        .output()
        .unwrap()
}

/// Runs an account command (groupadd, useradd, setfacl...); retries while another process holds
/// /etc/passwd's lock (tests run side by side).
pub fn sh(cmd: &str, args: &[&str]) {
    for _ in 0..50 {
        let out = Command::new(cmd).args(args).output().unwrap();
        if out.status.success() {
            return;
        }
        if !String::from_utf8_lossy(&out.stderr).contains("lock") {
            panic!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{cmd} {args:?}: lock busy");
}

/// `id FLAG USER` as a number (`-u`: uid, `-g`: primary gid).
pub fn id(flag: &str, user: &str) -> u32 {
    let out = Command::new("id").args([flag, user]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Writes `root/tenancy.toml`: one tier, tenant `acme` of group root, state, audit log and
/// scratch under `root`. Returns its path.
pub fn minimal_config(root: &Path) -> PathBuf {
    let config = root.join("tenancy.toml");
    std::fs::write(&config, TenancyToml::minimal("t", root).to_string()).unwrap();
    config
}

/// A successful record of alice (uid 1001) on `node` of cluster `t`, made by `program`.
pub fn alice_record(node: &str, event: Event, program: &str) -> Record {
    Record::new("t", node, "alice", 1001, event, Outcome::Success, program)
}

/// Job `id`'s end on `node`, as the epilog records it.
pub fn job_end(node: &str, id: u64) -> Record {
    alice_record(node, Event::JobEnd, "tenancy-epilog").job_id(id)
}

/// A network namespace of the test's (`ip netns add`); on drop it is deleted, and so are the
/// tenant's cgroup folders that reconcile made.
pub struct TestNetns {
    name: String,
    tenant: String,
}

impl TestNetns {
    pub fn add(name: &str, tenant: &str) -> Self {
        sh("ip", &["netns", "add", name]);
        TestNetns {
            name: name.to_string(),
            tenant: tenant.to_string(),
        }
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        for d in ["unified", "freezer"] {
            let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{d}/tenancy/{}", self.tenant));
        }
    }
}
