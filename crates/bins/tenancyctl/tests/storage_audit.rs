//! `tenancyctl storage-audit` maps the config's tenants to their members' uids as well as their
//! groups: a file a user of another tenant owns, or a `user:` ACL entry naming one, is reported
//! as what it gives that tenant, where a group-only map saw nobody.

mod common;
use common::{id, sh};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use tenancy_test_support::{requires_root, TenancyToml};

/// Users first, then their groups, whatever the test did.
struct Accounts {
    users: Vec<String>,
    groups: Vec<String>,
}

impl Drop for Accounts {
    fn drop(&mut self) {
        for u in &self.users {
            let _ = Command::new("userdel").arg(u).output();
        }
        for g in &self.groups {
            let _ = Command::new("groupdel").arg(g).output();
        }
    }
}

#[test]
fn a_file_owned_by_or_granted_to_another_tenants_user_is_reported() {
    if !requires_root(
        "a_file_owned_by_or_granted_to_another_tenants_user_is_reported: real users, chown, setfacl",
    ) {
        return;
    }
    let tag = format!("sa{}", std::process::id());
    let (ga, gb) = (format!("{tag}a"), format!("{tag}b"));
    let (ua, ub, both) = (format!("{tag}ua"), format!("{tag}ub"), format!("{tag}ab"));
    let _accounts = Accounts {
        users: vec![ua.clone(), ub.clone(), both.clone()],
        groups: vec![ga.clone(), gb.clone()],
    };
    sh("groupadd", &[&ga]);
    sh("groupadd", &[&gb]);
    let nologin = ["-M", "-N", "-s", "/usr/sbin/nologin"];
    sh("useradd", &[&nologin[..], &["-g", &ga, &ua]].concat());
    // ub is in tenant b by its primary group; `both` by its primary group and a member list.
    sh("useradd", &[&nologin[..], &["-g", &gb, &ub]].concat());
    sh(
        "useradd",
        &[&nologin[..], &["-g", &gb, "-G", &ga, &both]].concat(),
    );

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let config = root.join("tenancy.toml");
    let mut text = TenancyToml::under("t", root);
    text.tier("internal");
    text.tenant("ta").tier("internal").groups([&ga]);
    text.tenant("tb").tier("internal").groups([&gb]);
    std::fs::write(&config, text.to_string()).unwrap();
    // Tenant a's tree as the scratch layer makes it: the tenant folder root:a 0750, a job folder
    // of ua 0700.
    let scratch = root.join("scratch");
    let tree = scratch.join("ta");
    let job = tree.join("job_1");
    let a = tenancy_config::group_gid(&ga).unwrap();
    for (dir, uid, gid, mode) in [
        (&scratch, 0, 0, 0o755),
        (&tree, 0, a, 0o750),
        (&job, id("-u", &ua), a, 0o700),
    ] {
        std::fs::create_dir(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let file = |name: &str, owner: &str| {
        let p = job.join(name);
        std::fs::write(&p, "data").unwrap();
        std::os::unix::fs::chown(
            &p,
            Some(id("-u", owner)),
            Some(tenancy_config::group_gid(&ga).unwrap()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    };
    let audit = || -> (Option<i32>, Vec<serde_json::Value>) {
        let o = Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
            .arg("--config")
            .arg(&config)
            .args(["storage-audit", "--format", "json", "--no-progress"])
            .arg(&scratch)
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
        (
            o.status.code(),
            report["findings"].as_array().unwrap().clone(),
        )
    };
    let find =
        |findings: &[serde_json::Value], rule: &str, path: &Path| -> Option<serde_json::Value> {
            findings
                .iter()
                .find(|f| f["rule"] == rule && f["path"] == path.to_str().unwrap())
                .cloned()
        };

    // Files of ua and of a user in both tenants: nothing to report.
    file("own", &ua);
    file("shared-user", &both);
    let (code, findings) = audit();
    assert_eq!(code, Some(0), "{findings:#?}");

    // A file of tenant b's user inside tenant a's tree: b's member owns it.
    let planted = file("planted", &ub);
    // A `user:` ACL entry for tenant b's user along the path, and on a file of ua.
    let granted = file("granted", &ua);
    for (p, perms) in [(&tree, "x"), (&job, "x"), (&granted, "r")] {
        sh(
            "setfacl",
            &["-m", &format!("u:{ub}:{perms}"), p.to_str().unwrap()],
        );
    }
    let (code, findings) = audit();
    assert_eq!(code, Some(1), "{findings:#?}");
    let owner = find(&findings, "foreign-owner", &planted).expect("foreign owner reported");
    assert_eq!(owner["who"], "tenant tb", "{owner}");
    let exposed = find(&findings, "exposed", &granted).expect("user ACL entry reported");
    assert_eq!(
        (&exposed["who"], &exposed["perms"]),
        (&"tenant tb".into(), &"r--".into()),
        "{exposed}"
    );
    assert!(
        find(&findings, "foreign-owner", &job.join("shared-user")).is_none(),
        "a user in both tenants is mapped to none: {findings:#?}"
    );
}
