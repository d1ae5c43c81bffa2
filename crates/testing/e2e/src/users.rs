//! Test users and groups: created with useradd/groupadd under unique names, removed on Drop.

use anyhow::{bail, Context, Result};
use std::process::Command;

#[derive(Debug, Clone)]
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Primary and supplementary gids.
    pub gids: Vec<u32>,
}

/// Users and groups made for one test run; all removed on Drop.
#[derive(Default)]
pub struct Users {
    users: Vec<String>,
    groups: Vec<String>,
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Users {
    pub fn new() -> Users {
        Users::default()
    }

    /// Creates group `name` (must not exist).
    pub fn group(&mut self, name: &str) -> Result<u32> {
        run(Command::new("groupadd").arg(name))?;
        self.groups.push(name.to_string());
        let g = nix::unistd::Group::from_name(name)?
            .with_context(|| format!("group {name} not found after groupadd"))?;
        Ok(g.gid.as_raw())
    }

    /// Creates user `name` with its own primary group of the same name and the supplementary
    /// `groups`.
    pub fn user(&mut self, name: &str, groups: &[&str]) -> Result<TestUser> {
        let mut cmd = Command::new("useradd");
        cmd.args(["-M", "-N", "-d", "/nonexistent", "-s", "/bin/sh"]);
        // Own primary group, so that membership comes only from the listed groups.
        let primary = name.to_string();
        self.group(&primary)?;
        cmd.args(["-g", &primary]);
        if !groups.is_empty() {
            cmd.args(["-G", &groups.join(",")]);
        }
        cmd.arg(name);
        run(&mut cmd)?;
        self.users.push(name.to_string());
        let u = nix::unistd::User::from_name(name)?
            .with_context(|| format!("user {name} not found after useradd"))?;
        let cname = std::ffi::CString::new(name)?;
        let gids = nix::unistd::getgrouplist(&cname, u.gid)?
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        Ok(TestUser {
            name: name.to_string(),
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            gids,
        })
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for u in self.users.drain(..).rev() {
            let _ = Command::new("userdel").arg(&u).output();
        }
        for g in self.groups.drain(..).rev() {
            let _ = Command::new("groupdel").arg(&g).output();
        }
    }
}
