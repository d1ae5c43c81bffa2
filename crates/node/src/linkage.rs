//! How this process was linked, and what that lets it do. `tenancy-prolog` and `tenancy-epilog`
//! are static PIEs (build-support/link.rs): they start without the dynamic loader, and so cannot
//! load shared libraries: NVML for a MIG slice, NSS modules (sssd, LDAP, systemd) for users and
//! groups. A job that needs one is handed to `tenancy-prolog-dynamic` beside them
//! (`crate::run`), the same prolog and epilog dynamically linked.

use std::path::Path;
use std::sync::OnceLock;

/// The file that names this node's NSS sources.
pub const NSSWITCH: &str = "/etc/nsswitch.conf";

/// True when the dynamic loader started this process, so it can load shared libraries. The
/// kernel starts a static program directly: no interpreter, and AT_BASE (the interpreter's
/// load address) is 0. dlopen in a static glibc program would load a second libc beside the
/// built-in one (the NVML stand-in crashes there), so a layer that needs a library asks first.
pub fn can_load_libraries() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process.
    unsafe { libc::getauxval(libc::AT_BASE) != 0 }
}

/// The NSS databases the prolog reads: users, groups, and a user's group list (getgrouplist
/// reads `initgroups` when nsswitch.conf has that line, else `group`).
const DATABASES: [&str; 3] = ["passwd", "group", "initgroups"];

/// Where systemd's userdb takes drop-in user, group and membership records (nss-systemd(8)):
/// the one way that source can put a user of /etc/passwd into more groups.
const USERDB_DROP_INS: [&str; 5] = [
    "/etc/userdb",
    "/run/userdb",
    "/run/host/userdb",
    "/usr/local/lib/userdb",
    "/usr/lib/userdb",
];

/// Whether this process answers the prolog's identity questions (who is uid N, is N in group
/// G) as the node's NSS would. A dynamically linked process asks NSS itself. A static one can
/// use glibc's built-in `files` source (/etc/passwd, /etc/group, and nscd when it runs) but no
/// NSS module: a static glibc loads modules only from the exact glibc build it was linked with.
/// musl, which the job path is built with where the toolchain can (scripts/build-job-path),
/// reads the same files and nscd, and never loads a module.
///
/// So a static process answers only where `files` speaks for NSS: nsswitch.conf lists `files`
/// first for users and groups, and at most `systemd` after it, with no userdb drop-in folder
/// (without drop-ins, systemd adds no group to a user of /etc/passwd; its own users are not in
/// that file). Then every lookup of this process is pinned to `files`, so no module is ever
/// loaded, and a user or group missing from the files reads as absent: the prolog hands such a
/// job (any denial) to the dynamic build, which asks every source. `Err` says why this node
/// needs the dynamic build for every job. Decided once per process.
pub fn identity_from_files() -> Result<(), String> {
    static DECIDED: OnceLock<Result<(), String>> = OnceLock::new();
    DECIDED
        .get_or_init(|| {
            if can_load_libraries() {
                return Ok(());
            }
            let text = std::fs::read_to_string(NSSWITCH)
                .map_err(|e| format!("cannot read {NSSWITCH}: {e}"))?;
            files_speak_for_nss(&text, |p| p.exists())?;
            pin_to_files()
        })
        .clone()
}

/// The check of [`identity_from_files`] on nsswitch.conf's text; `exists` tells whether a
/// userdb drop-in folder exists.
pub fn files_speak_for_nss(nsswitch: &str, exists: impl Fn(&Path) -> bool) -> Result<(), String> {
    let mut with_systemd = false;
    for db in DATABASES {
        // Read as glibc (2.33+) reads it: the database's name ends at a blank or a colon, and
        // a later line for the same database replaces an earlier one.
        let line = nsswitch.lines().rev().find_map(|l| {
            let l = l.split('#').next().unwrap_or_default().trim_start();
            let end = l.find(|c: char| c == ':' || c.is_whitespace())?;
            let (name, rest) = l.split_at(end);
            let sources = rest.trim_start_matches(|c: char| c == ':' || c.is_whitespace());
            (name == db).then(|| sources.trim_end().to_string())
        });
        let Some(sources) = line else {
            // getgrouplist falls back to `group` without an `initgroups` line.
            if db == "initgroups" {
                continue;
            }
            return Err(format!("{NSSWITCH} has no `{db}:` line"));
        };
        let tokens: Vec<&str> = sources.split_whitespace().collect();
        let plain = !sources.contains('[')
            && tokens.first() == Some(&"files")
            && tokens[1..].iter().all(|s| *s == "systemd");
        if !plain {
            return Err(format!(
                "{NSSWITCH} says `{db}: {sources}`: users and groups come from more than \
                 /etc/passwd and /etc/group"
            ));
        }
        with_systemd |= tokens.len() > 1;
    }
    if with_systemd {
        if let Some(dir) = USERDB_DROP_INS.iter().find(|d| exists(Path::new(d))) {
            return Err(format!(
                "systemd's userdb drop-in folder {dir} exists: it can add groups to users of \
                 /etc/passwd"
            ));
        }
    }
    Ok(())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn pin_to_files() -> Result<(), String> {
    extern "C" {
        /// glibc (nss.h): sets a database's sources as an nsswitch.conf line would, for this
        /// process, which then no longer reads that line from nsswitch.conf.
        fn __nss_configure_lookup(
            db: *const std::os::raw::c_char,
            sources: *const std::os::raw::c_char,
        ) -> std::os::raw::c_int;
    }
    for db in [c"passwd", c"group", c"initgroups"] {
        // SAFETY: two NUL-terminated strings; glibc copies what it keeps. Called before any
        // lookup, with one thread.
        if unsafe { __nss_configure_lookup(db.as_ptr(), c"files".as_ptr()) } != 0 {
            return Err(format!(
                "glibc refused to limit the {} lookups to files",
                db.to_string_lossy()
            ));
        }
    }
    Ok(())
}

/// musl (the job path's build, scripts/build-job-path) has no NSS modules to pin: its lookups
/// read /etc/passwd and /etc/group, then ask nscd when it runs, as glibc's `files` does.
#[cfg(all(target_os = "linux", target_env = "musl"))]
fn pin_to_files() -> Result<(), String> {
    Ok(())
}

#[cfg(not(all(target_os = "linux", any(target_env = "gnu", target_env = "musl"))))]
fn pin_to_files() -> Result<(), String> {
    Err("only glibc can limit NSS lookups to files".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_binary_is_dynamically_linked() {
        // cargo links test harnesses dynamically; a false here would mean AT_BASE is misread.
        assert!(super::can_load_libraries());
        // ... and asks NSS itself.
        assert_eq!(identity_from_files(), Ok(()));
    }

    const DEBIAN: &str = "# /etc/nsswitch.conf\n\npasswd:         files systemd\n\
                          group:          files systemd\nshadow:         files systemd\n\
                          hosts:          files dns\nnetgroup:       nis\n";

    #[test]
    fn files_speak_for_nss_with_files_and_systemd_without_drop_ins() {
        assert_eq!(files_speak_for_nss(DEBIAN, |_| false), Ok(()));
        let plain = "passwd: files\ngroup: files # local\ninitgroups: files\n";
        assert_eq!(files_speak_for_nss(plain, |_| true), Ok(()));
        // The last line for a database is the one glibc uses.
        let later = "passwd: sss\npasswd files\ngroup: files\n";
        assert_eq!(files_speak_for_nss(later, |_| true), Ok(()));
        // A drop-in folder can give a user of /etc/passwd more groups: not with systemd listed.
        let e = files_speak_for_nss(DEBIAN, |p| p == Path::new("/etc/userdb")).unwrap_err();
        assert!(e.contains("/etc/userdb"), "{e}");
    }

    #[test]
    fn any_other_source_order_or_action_needs_the_dynamic_build() {
        for (text, names) in [
            ("passwd: files sss\ngroup: files sss\n", "passwd: files sss"),
            ("passwd: sss files\ngroup: files\n", "passwd: sss files"),
            ("passwd: compat\ngroup: compat\n", "passwd: compat"),
            (
                "passwd: files\ngroup: files [SUCCESS=merge] systemd\n",
                "group: files [SUCCESS=merge]",
            ),
            (
                "passwd: files\ngroup: files\ninitgroups: files ldap\n",
                "initgroups: files ldap",
            ),
            ("passwd: files\n", "no `group:` line"),
            // glibc takes the last line of a database, and its name may end at a blank.
            ("passwd: files\ngroup: files\ngroup: sss\n", "group: sss"),
            ("passwd: files\ngroup: files\ngroup sss\n", "group: sss"),
            ("passwd: files\ngroup: files\ngroup:\n", "group: `"),
            (
                "passwd: systemd files\ngroup: files\n",
                "passwd: systemd files",
            ),
        ] {
            let e = files_speak_for_nss(text, |_| false).unwrap_err();
            assert!(e.contains(names), "{text:?}: {e}");
        }
    }
}
