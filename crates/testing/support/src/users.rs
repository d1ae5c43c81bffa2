//! Real users and groups for root tests (useradd/groupadd, removed on drop), a scratch tree
//! under a temp folder, and running a command as another user (setgroups/setgid/setuid in the
//! child): the scratch layer's tests and storage-audit's.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn id_of(flag: &str, name: &str) -> u32 {
    let out = Command::new("id").args([flag, name]).output().unwrap();
    assert!(
        out.status.success(),
        "id {flag} {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(tag: &str) -> String {
    format!(
        "ts{}{}{}",
        std::process::id(),
        tag,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A group made for the test; removed on drop.
pub struct Group {
    pub name: String,
    pub gid: u32,
}
impl Group {
    pub fn new(tag: &str) -> Group {
        let name = unique(tag);
        run("groupadd", &[&name]);
        let out = Command::new("getent")
            .args(["group", &name])
            .output()
            .unwrap();
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        let gid = line.split(':').nth(2).unwrap().parse().unwrap();
        Group { name, gid }
    }
}
impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.name).status();
    }
}

/// A user made for the test (primary group `group`); removed on drop.
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}
impl User {
    pub fn new(tag: &str, group: &Group) -> User {
        let name = unique(tag);
        run(
            "useradd",
            &[
                "-M",
                "-N",
                "-g",
                &group.name,
                "-s",
                "/usr/sbin/nologin",
                &name,
            ],
        );
        let uid = id_of("-u", &name);
        let gid = id_of("-g", &name);
        User { name, uid, gid }
    }
    /// Supplementary gids from NSS, as a login would get them.
    pub fn gids(&self) -> Vec<u32> {
        let out = Command::new("id")
            .args(["-G", &self.name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|g| g.parse().unwrap())
            .collect()
    }
    /// Runs `cmd args` as this user (its uid, primary gid and NSS groups).
    pub fn run(&self, cmd: &str, args: &[&str]) -> Output {
        let mut c = Command::new(cmd);
        c.args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LC_ALL", "C");
        crate::run_as(&mut c, self.uid, self.gid, self.gids());
        c.output().unwrap()
    }
}
impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// A temp folder reachable by everyone (0755), so only the scratch tree's own modes protect.
pub struct Tree {
    pub dir: tempfile::TempDir,
}
impl Default for Tree {
    fn default() -> Tree {
        Tree::new()
    }
}
impl Tree {
    pub fn new() -> Tree {
        let dir = tempfile::Builder::new()
            .prefix("scratch-test")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Tree { dir }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    /// `<tmp>/scratch`, root:root 0755.
    pub fn scratch_root(&self) -> PathBuf {
        let p = self.path().join("scratch");
        if !p.exists() {
            std::fs::create_dir(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        p
    }
}

/// Owner, group, mode and a listing of a folder (to prove "untouched").
pub fn snapshot(p: &Path) -> Vec<(PathBuf, u32, u32, u32)> {
    let mut v = Vec::new();
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        v.push((d.clone(), m.uid(), m.gid(), m.mode()));
        if m.is_dir() {
            for e in std::fs::read_dir(&d).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    v.sort();
    v
}

pub fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}
pub fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}
pub fn setfacl(args: &[&str]) {
    run("setfacl", args);
}
