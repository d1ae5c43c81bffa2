//! What the product reads of slurm.conf: its nodes (`NodeName=` lines, hostlists, `Include`d
//! files followed), and the single-valued keys the scheduler layer checks (`ClusterName`,
//! `AccountingStorageEnforce`, `MCSPlugin`, `MCSParameters`, ...). Read by tenancyctl (check,
//! doctor, slurm sync) and by job_submit/tenancy in slurmctld.

use crate::hostlist::Hostlist;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where slurm.conf is when nothing names it: `SLURM_CONF`, else Slurm's default.
pub fn default_path() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"))
}

/// The parts of a slurm.conf (and the files it includes) the product uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmConf {
    pub path: PathBuf,
    /// Every node name of the `NodeName=` lines, each once, in order.
    pub nodes: Vec<String>,
    node_set: BTreeSet<String>,
    /// `key=value` of every other line, key lowercased; the last one wins, as in Slurm.
    keys: BTreeMap<String, String>,
    /// The files `Include` lines brought in, in order.
    pub included: Vec<PathBuf>,
}

impl SlurmConf {
    /// Reads `path` and what it includes.
    pub fn load(path: &Path) -> Result<SlurmConf, String> {
        let mut conf = SlurmConf {
            path: path.to_path_buf(),
            ..Default::default()
        };
        conf.read(path, 0)?;
        Ok(conf)
    }

    /// Parses `text` as the file `path` (includes are read relative to its folder).
    pub fn parse(text: &str, path: &Path) -> Result<SlurmConf, String> {
        let mut conf = SlurmConf {
            path: path.to_path_buf(),
            ..Default::default()
        };
        conf.lines(text, path, 0)?;
        Ok(conf)
    }

    fn read(&mut self, path: &Path, depth: u32) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        self.lines(&text, path, depth)
    }

    fn lines(&mut self, text: &str, path: &Path, depth: u32) -> Result<(), String> {
        if depth > 8 {
            return Err(format!("{}: Include nested too deep", path.display()));
        }
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let at = || format!("{}:{}", path.display(), n + 1);
            if let Some(file) = line
                .split_once(char::is_whitespace)
                .filter(|(k, _)| k.eq_ignore_ascii_case("include"))
                .map(|(_, f)| f.trim())
            {
                let inc = Path::new(file);
                let inc = if inc.is_absolute() {
                    inc.to_path_buf()
                } else {
                    path.parent().unwrap_or(Path::new("/")).join(inc)
                };
                self.read(&inc, depth + 1)
                    .map_err(|e| format!("{} (Include): {e}", at()))?;
                self.included.push(inc);
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim().to_ascii_lowercase();
            if key == "nodename" {
                let names = value.split_whitespace().next().unwrap_or_default();
                if names.eq_ignore_ascii_case("default") {
                    continue;
                }
                let list = Hostlist::parse(names).map_err(|e| format!("{}: NodeName {e}", at()))?;
                for name in list.names() {
                    if self.node_set.insert(name.clone()) {
                        self.nodes.push(name);
                    }
                }
            } else if !matches!(key.as_str(), "partitionname" | "nodeset" | "frontendname") {
                self.keys.insert(key, value.trim().to_string());
            }
        }
        Ok(())
    }

    /// The value of a single-valued key (case-insensitive), as written.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.keys.get(&key.to_ascii_lowercase()).map(String::as_str)
    }

    /// The comma-separated items of `key`, lowercased (`AccountingStorageEnforce=limits,qos`).
    pub fn list(&self, key: &str) -> Vec<String> {
        self.get(key)
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn has_node(&self, name: &str) -> bool {
        self.node_set.contains(name)
    }

    /// The names of `list` that are not nodes here.
    pub fn unknown_nodes(&self, list: &Hostlist) -> Vec<String> {
        list.names()
            .into_iter()
            .filter(|n| !self.has_node(n))
            .collect()
    }

    /// Whether `AccountingStorageEnforce` makes slurmctld enforce association limits
    /// (`limits`, or `safe`, which implies it).
    pub fn enforces_limits(&self) -> bool {
        self.list("AccountingStorageEnforce")
            .iter()
            .any(|v| v == "limits" || v == "safe")
    }
}

/// What MCS gives the scheduler layer: which plugin labels jobs, and whether slurmctld keeps
/// jobs of different labels off each other's nodes (slurm.conf `MCSPlugin`, `MCSParameters`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mcs {
    /// `account`, `group`, `label`, `user` or `none`.
    pub plugin: String,
    /// `enforced`: Slurm labels every job (with its own default when none is given).
    pub enforced: bool,
    /// `select` (always) or `ondemandselect` (jobs with `--exclusive=mcs`): nodes are filtered by
    /// label; `noselect`: never.
    pub select: McsSelect,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McsSelect {
    Always,
    OnDemand,
    Never,
}

impl SlurmConf {
    /// MCS as slurm.conf sets it (Slurm's defaults: mcs/none, `ondemand,ondemandselect`).
    pub fn mcs(&self) -> Mcs {
        let plugin = self
            .get("MCSPlugin")
            .map(|p| p.trim().to_ascii_lowercase())
            .unwrap_or_else(|| "mcs/none".into());
        let params = self
            .get("MCSParameters")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let common = params.split(':').next().unwrap_or_default();
        // Slurm looks for substrings, in this order (src/interfaces/mcs.c).
        let select = if common.contains("noselect") {
            McsSelect::Never
        } else if common.contains("ondemandselect") {
            McsSelect::OnDemand
        } else if common.contains("select") {
            McsSelect::Always
        } else {
            McsSelect::OnDemand
        };
        Mcs {
            plugin: plugin.trim_start_matches("mcs/").to_string(),
            enforced: common.contains("enforced"),
            select,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nodes_includes_and_keys() {
        let dir = tempfile_dir();
        std::fs::write(
            dir.join("nodes.conf"),
            "NodeName=DEFAULT CPUs=4\nNodeName=gpu[01-04] Gres=gpu:1\nNodeName=cpu1,cpu2 # two\n",
        )
        .unwrap();
        let main = dir.join("slurm.conf");
        std::fs::write(
            &main,
            "ClusterName=c1\naccountingstorageenforce = associations,Limits\n\
             include nodes.conf\nPartitionName=p Nodes=ALL\nMCSPlugin=mcs/label\n\
             MCSParameters=ondemand,select\n",
        )
        .unwrap();
        let c = SlurmConf::load(&main).unwrap();
        assert_eq!(
            c.nodes,
            ["gpu01", "gpu02", "gpu03", "gpu04", "cpu1", "cpu2"]
        );
        assert_eq!(c.get("clustername"), Some("c1"));
        assert!(c.enforces_limits());
        let m = c.mcs();
        assert_eq!(
            (m.plugin.as_str(), m.enforced, m.select),
            ("label", false, McsSelect::Always)
        );
        let pool = Hostlist::parse("gpu[03-05]").unwrap();
        assert_eq!(c.unknown_nodes(&pool), ["gpu05"]);
        let none = SlurmConf::parse("AccountingStorageEnforce=associations\n", &main).unwrap();
        assert!(!none.enforces_limits());
        assert_eq!(none.mcs().plugin, "none");
        let e = SlurmConf::parse("Include missing.conf\n", &main).unwrap_err();
        assert!(
            e.contains("missing.conf") && e.contains("slurm.conf:1"),
            "{e}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tenancy-slurmconf-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
