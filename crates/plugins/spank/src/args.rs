//! Parsing of the plugstack.conf arguments and of the submit command line.

use std::path::PathBuf;

/// Arguments after the plugin path in plugstack.conf.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PluginArgs {
    /// `config=PATH`: the tenancy config (else TENANCY_CONFIG, tenancy.toml next to SLURM_CONF,
    /// /etc/slurm/tenancy.toml).
    pub config: Option<PathBuf>,
}

/// Parses `config=PATH`; anything else is an error (a typo must not silently change policy).
pub fn parse_plugin_args(args: &[String]) -> Result<PluginArgs, String> {
    let mut out = PluginArgs::default();
    for a in args {
        match a.split_once('=') {
            Some(("config", p)) if p.starts_with('/') => out.config = Some(PathBuf::from(p)),
            Some(("config", p)) => {
                return Err(format!(
                    "plugstack.conf: config={p} must be an absolute path"
                ))
            }
            _ => {
                return Err(format!(
                    "plugstack.conf: unknown argument '{}' (the plugin takes config=/path/tenancy.toml)",
                    a.escape_default()
                ))
            }
        }
    }
    Ok(out)
}

/// The `--account`/`-A` given on a NUL-separated command line (as in /proc/self/cmdline), so
/// that an account/tenant mismatch is refused at submit time. Options after the script or
/// command name are the job's own and are not looked at.
pub fn account_from_cmdline(cmdline: &[u8]) -> Option<String> {
    let words: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let mut found = None;
    let mut i = 1;
    while i < words.len() {
        let w = &words[i];
        if w == "--" || !w.starts_with('-') {
            break;
        }
        if let Some(v) = w.strip_prefix("--account=") {
            found = Some(v.to_string());
        } else if w == "--account" || w == "-A" {
            found = words.get(i + 1).cloned();
            i += 1;
        } else if let Some(v) = w.strip_prefix("-A") {
            found = Some(v.to_string());
        } else if takes_separate_value(w) {
            i += 1;
        }
        i += 1;
    }
    found.filter(|a| !a.is_empty())
}

/// Short options of sbatch/srun/salloc that take their value as the next word (so that the
/// value is not mistaken for the script). Long options are written `--opt=value` or
/// `--opt value`; for the latter we cannot know without Slurm's table, so the common ones are
/// listed.
fn takes_separate_value(w: &str) -> bool {
    const SHORT: &[&str] = &[
        "-p", "-n", "-N", "-c", "-t", "-J", "-o", "-e", "-w", "-x", "-D", "-d", "-q", "-G", "-C",
        "-L", "-M", "-a", "-i", "-b", "-m", "-F", "-B", "-S",
    ];
    const LONG: &[&str] = &[
        "--partition",
        "--ntasks",
        "--nodes",
        "--cpus-per-task",
        "--time",
        "--job-name",
        "--output",
        "--error",
        "--nodelist",
        "--exclude",
        "--chdir",
        "--dependency",
        "--qos",
        "--gpus",
        "--gres",
        "--constraint",
        "--licenses",
        "--mem",
        "--mem-per-cpu",
        "--tenant",
        "--mig",
        "--array",
        "--export",
        "--reservation",
        "--wckey",
        "--comment",
    ];
    SHORT.contains(&w) || LONG.contains(&w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cl(words: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for w in words {
            v.extend_from_slice(w.as_bytes());
            v.push(0);
        }
        v
    }

    #[test]
    fn config_arg() {
        let a = parse_plugin_args(&["config=/etc/slurm/t.toml".into()]).unwrap();
        assert_eq!(a.config, Some(PathBuf::from("/etc/slurm/t.toml")));
        assert_eq!(parse_plugin_args(&[]).unwrap(), PluginArgs::default());
        assert!(parse_plugin_args(&["config=rel.toml".into()]).is_err());
        let e = parse_plugin_args(&["conifg=/x".into()]).unwrap_err();
        assert!(e.contains("unknown argument 'conifg=/x'"), "{e}");
    }

    #[test]
    fn account_forms() {
        assert_eq!(
            account_from_cmdline(&cl(&["sbatch", "-A", "acct", "job.sh"])).as_deref(),
            Some("acct")
        );
        assert_eq!(
            account_from_cmdline(&cl(&["sbatch", "-Aacct", "job.sh"])).as_deref(),
            Some("acct")
        );
        assert_eq!(
            account_from_cmdline(&cl(&["srun", "--account=a1", "hostname"])).as_deref(),
            Some("a1")
        );
        assert_eq!(
            account_from_cmdline(&cl(&["srun", "--account", "a2", "-n", "1", "x"])).as_deref(),
            Some("a2")
        );
        // After the script, options belong to the job.
        assert_eq!(
            account_from_cmdline(&cl(&["sbatch", "-p", "debug", "job.sh", "-A", "x"])),
            None
        );
        assert_eq!(
            account_from_cmdline(&cl(&[
                "sbatch",
                "--tenant",
                "acme",
                "job.sh",
                "--account=x"
            ])),
            None
        );
        assert_eq!(account_from_cmdline(&cl(&["sbatch"])), None);
    }
}
