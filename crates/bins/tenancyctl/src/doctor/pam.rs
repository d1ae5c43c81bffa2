//! ssh sessions: the PAM services that enable pam_slurm_adopt, and whether the sessions it
//! adopts join their job's isolation.

use super::{row, DoctorArgs, Row};
use std::path::{Path, PathBuf};
use tenancy_devices::doctor::Severity;

/// A PAM service file that enables `pam_slurm_adopt`.
struct AdoptingService {
    /// `file:line` of each pam_slurm_adopt line.
    adopt: Vec<String>,
    /// `file:line` of a `session required|requisite` line with pam_tenancy.so or
    /// `pam_exec.so ... tenancyctl adopt`, which moves adopted sessions into the job's
    /// isolation (or refuses them).
    hook: Option<String>,
    /// `file:line option` of each pam_slurm_adopt option that lets a user in without adopting
    /// the session into a job: such a session runs outside every job's device allowlist.
    lax: Vec<String>,
    /// `file:line` of each session line naming a pam_tenancy.so that is not installed (PAM
    /// then fails every login of the service).
    missing: Vec<String>,
    /// `file:line` of each `tenancyctl adopt` line without `--config`: pam_exec gives adopt only
    /// the PAM environment, so it then reads /etc/slurm/tenancy.toml.
    exec_default_config: Vec<String>,
}

/// Whether the PAM module `name` (a path, or a name Linux-PAM looks up in its module
/// folders) is installed.
fn pam_module_installed(name: &str) -> bool {
    let p = Path::new(name);
    if p.is_absolute() {
        return p.is_file();
    }
    let arch = std::env::consts::ARCH;
    [
        format!("/lib/{arch}-linux-gnu/security"),
        format!("/usr/lib/{arch}-linux-gnu/security"),
        "/lib/security".into(),
        "/lib64/security".into(),
        "/usr/lib64/security".into(),
        "/usr/lib/security".into(),
    ]
    .iter()
    .any(|d| Path::new(d).join(p).is_file())
}

/// The pam_slurm_adopt options of one line under which a user's session can pass without
/// being adopted into a job (pam_slurm_adopt's defaults: action_no_jobs=deny,
/// action_unknown=newest, action_adopt_failure=allow, action_generic_failure=ignore).
fn lax_adopt_options(words: &[&str]) -> Vec<String> {
    let value = |key: &str| {
        words
            .iter()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    };
    let mut lax = Vec::new();
    if value("action_no_jobs") == Some("ignore") {
        lax.push("action_no_jobs=ignore".to_string());
    }
    if value("action_unknown") == Some("allow") {
        lax.push("action_unknown=allow".to_string());
    }
    for (key, default) in [
        ("action_adopt_failure", "allow"),
        ("action_generic_failure", "ignore"),
    ] {
        match value(key) {
            Some("deny") => {}
            Some(v) => lax.push(format!("{key}={v}")),
            None => lax.push(format!("{key}={default} (the default)")),
        }
    }
    lax
}

/// The PAM services under `dir` that enable `pam_slurm_adopt`: ssh sessions it adopts join the
/// job's extern step, which never passes through the SPANK task hook, so they run outside the
/// job's device allowlist and firewall unless `tenancyctl adopt` moves them.
fn pam_slurm_adopt_services(dir: &Path) -> std::io::Result<Vec<AdoptingService>> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let mut svc = AdoptingService {
            adopt: Vec::new(),
            hook: None,
            lax: Vec::new(),
            missing: Vec::new(),
            exec_default_config: Vec::new(),
        };
        for (n, line) in text.lines().enumerate() {
            let active = line.split('#').next().unwrap_or_default();
            let at = || format!("{}:{}", file.display(), n + 1);
            let words: Vec<&str> = active.split_whitespace().collect();
            if active.contains("pam_slurm_adopt") {
                svc.adopt.push(at());
                for o in lax_adopt_options(&words) {
                    svc.lax.push(format!("{} {o}", at()));
                }
            }
            // An optional hook would let a refused session go on: only required/requisite count.
            let session_required = words.len() >= 3
                && words[0] == "session"
                && matches!(words[1], "required" | "requisite");
            let module = session_required && words[2].ends_with("pam_tenancy.so");
            if module && !pam_module_installed(words[2]) {
                svc.missing.push(format!("{} ({})", at(), words[2]));
                continue;
            }
            // `tenancyctl [--config PATH] adopt [...]`
            let tenancyctl = words.iter().position(|w| w.ends_with("tenancyctl"));
            let exec = session_required
                && words[2].ends_with("pam_exec.so")
                && tenancyctl.is_some_and(|i| words[i + 1..].contains(&"adopt"));
            if exec && !words.iter().any(|w| w.starts_with("--config")) {
                svc.exec_default_config.push(at());
            }
            if module || exec {
                svc.hook = Some(at());
            }
        }
        if !svc.adopt.is_empty() {
            out.push(svc);
        }
    }
    Ok(out)
}

/// ssh sessions pam_slurm_adopt adopts into jobs; whether every such session joins its job's
/// isolation (`None`: none is adopted).
pub(super) fn pam_rows(args: &DoctorArgs, rows: &mut Vec<Row>) -> Option<bool> {
    let pam = pam_slurm_adopt_services(&args.pam_dir);
    if let Ok(svcs) = &pam {
        rows.extend(pam_fallback_row(svcs));
        rows.extend(pam_config_row(svcs));
    }
    let ssh_contained = match &pam {
        Ok(svcs) if !svcs.is_empty() => Some(svcs.iter().all(|s| s.hook.is_some())),
        _ => None,
    };
    rows.push(pam_adopt_row(args, pam));
    ssh_contained
}

/// pam_slurm_adopt letting users in that it did not adopt.
fn pam_fallback_row(svcs: &[AdoptingService]) -> Option<Row> {
    let lax: Vec<String> = svcs.iter().flat_map(|s| s.lax.iter().cloned()).collect();
    if !lax.is_empty() {
        return Some(row(
            "slurm.pam_adopt_fallback",
            Severity::Warn,
            format!(
                "pam_slurm_adopt lets users in without adopting them into a job ({}): \
                 such sessions run outside every job's device allowlist and firewall",
                lax.join(", ")
            ),
            Some(
                "give pam_slurm_adopt action_no_jobs=deny action_adopt_failure=deny \
                 action_generic_failure=deny, and let administrators in with pam_access"
                    .into(),
            ),
        ));
    }
    None
}

/// `tenancyctl adopt` run by pam_exec without a config it can find.
fn pam_config_row(svcs: &[AdoptingService]) -> Option<Row> {
    let lines: Vec<String> = svcs
        .iter()
        .flat_map(|s| s.exec_default_config.iter().cloned())
        .collect();
    if !lines.is_empty() && !Path::new(tenancy_config::DEFAULT_PATH).is_file() {
        return Some(row(
            "slurm.pam_adopt_config",
            Severity::Warn,
            format!(
                "pam_exec runs tenancyctl adopt without --config ({}) and {} does not \
                 exist: pam_exec passes adopt only the PAM environment, where TENANCY_CONFIG \
                 and SLURM_CONF are not set by sshd, so adopt finds no config and refuses \
                 every session pam_slurm_adopt adopts",
                lines.join(", "),
                tenancy_config::DEFAULT_PATH
            ),
            Some("put --config PATH on that line: `tenancyctl --config PATH adopt`".into()),
        ));
    }
    None
}

/// Whether the sessions pam_slurm_adopt adopts join the job's isolation.
fn pam_adopt_row(args: &DoctorArgs, pam: std::io::Result<Vec<AdoptingService>>) -> Row {
    match pam {
        Ok(svcs) if svcs.is_empty() => row(
            "slurm.pam_adopt",
            Severity::Ok,
            format!(
                "pam_slurm_adopt is not enabled in {}",
                args.pam_dir.display()
            ),
            None,
        ),
        Ok(svcs) => {
            let (hooked, bare): (Vec<_>, Vec<_>) = svcs.iter().partition(|s| s.hook.is_some());
            let lines = |v: &[&AdoptingService]| {
                v.iter()
                    .flat_map(|s| s.adopt.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if bare.is_empty() {
                row(
                    "slurm.pam_adopt",
                    Severity::Ok,
                    format!(
                        "pam_slurm_adopt is enabled ({}) and the sessions it adopts join the job's \
                         isolation through pam_tenancy.so or tenancyctl adopt ({})",
                        lines(&hooked),
                        hooked
                            .iter()
                            .filter_map(|s| s.hook.clone())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None,
                )
            } else {
                let missing: Vec<String> = bare
                    .iter()
                    .flat_map(|s| s.missing.iter().cloned())
                    .collect();
                if !missing.is_empty() {
                    row(
                        "slurm.pam_adopt",
                        Severity::Error,
                        format!(
                            "pam_slurm_adopt is enabled ({}) and the session phase names \
                             pam_tenancy.so, which is not installed ({}): PAM fails every login \
                             of that service",
                            lines(&bare),
                            missing.join(", ")
                        ),
                        Some(format!(
                            "install -m 0644 target/release/libpam_tenancy.so \
                             /lib/{}-linux-gnu/security/pam_tenancy.so",
                            std::env::consts::ARCH
                        )),
                    )
                } else {
                    row(
                        "slurm.pam_adopt",
                        Severity::Error,
                        format!(
                            "pam_slurm_adopt is enabled ({}) without pam_tenancy.so or \
                             tenancyctl adopt: ssh sessions it adopts into a job skip the SPANK \
                             task hook and run without the job's device allowlist and firewall",
                            lines(&bare)
                        ),
                        Some(
                            "add `session required pam_tenancy.so` (or `session required \
                             pam_exec.so /usr/local/bin/tenancyctl --config PATH adopt`) to that PAM service, \
                             after pam_slurm_adopt, or remove pam_slurm_adopt"
                                .into(),
                        ),
                    )
                }
            }
        }
        Err(e) => row(
            "slurm.pam_adopt",
            Severity::Warn,
            format!("cannot read {}: {e}", args.pam_dir.display()),
            None,
        ),
    }
}
