//! tenancy.toml text for tests: a plain builder over the config's keys (crates/config), so a
//! test names the keys it means and never writes TOML by hand.
//!
//! Sections come out in the order they were first asked for, keys in the order they were set
//! (setting a key again replaces its value where it stands), one `key = value` a line and no
//! blank lines: `[cluster]`, `[node]`, `[network]`, `[mig.plan.<model>]`, `[tiers.<name>]`,
//! `[tenants.<name>]`, `[billing]` and `[billing.rates]`. A tier's or tenant's `limits` is an
//! inline table ([`Limits`]).

use std::fmt;
use std::path::Path;

/// A tier's `scratch_on_exit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScratchOnExit {
    Wipe,
    Retain,
}

/// A tier's `gpu_placement` (with `share_gpu = false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuPlacement {
    Node,
    Gpu,
}

/// A tier's or tenant's `limits` (docs/quotas-and-pools.md): what all of a tenant's jobs may
/// hold at once, rendered as an inline table in the config's key order,
/// `{ gpus = 2, mig_slices = { "1g.18gb" = 1 }, nodes = 1, running_jobs = 4 }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    gpus: Option<u32>,
    mig_slices: Vec<(String, u32)>,
    nodes: Option<u32>,
    running_jobs: Option<u32>,
}

impl Limits {
    /// GPUs of any kind (a MIG slice counts as one).
    pub fn gpus(mut self, n: u32) -> Limits {
        self.gpus = Some(n);
        self
    }

    /// MIG slices of `profile` (set again, it replaces that profile's).
    pub fn mig_slices(mut self, profile: &str, n: u32) -> Limits {
        match self.mig_slices.iter_mut().find(|(p, _)| p == profile) {
            Some((_, v)) => *v = n,
            None => self.mig_slices.push((profile.to_string(), n)),
        }
        self
    }

    pub fn nodes(mut self, n: u32) -> Limits {
        self.nodes = Some(n);
        self
    }

    pub fn running_jobs(mut self, n: u32) -> Limits {
        self.running_jobs = Some(n);
        self
    }
}

/// The text of a tenancy.toml; [`fmt::Display`] renders it.
#[derive(Debug, Clone, Default)]
pub struct TenancyToml {
    sections: Vec<Section>,
}

#[derive(Debug, Clone)]
struct Section {
    name: String,
    keys: Vec<(String, String)>,
}

impl TenancyToml {
    /// `[cluster]` with its `name` alone (the other required keys through [`Self::cluster`]).
    pub fn new(name: &str) -> TenancyToml {
        let mut t = TenancyToml::default();
        t.section("cluster".into()).set("name", string(name));
        t
    }

    /// `[cluster]` with `name` and its required paths under `root`: `state_dir` root/state,
    /// `audit_log` root/audit.jsonl, `scratch_root` root/scratch.
    pub fn under(name: &str, root: &Path) -> TenancyToml {
        let mut t = TenancyToml::new(name);
        t.cluster()
            .state_dir(root.join("state"))
            .audit_log(root.join("audit.jsonl"))
            .scratch_root(root.join("scratch"));
        t
    }

    /// The smallest config with a tenant: [`Self::under`] `root`, tier `internal` (all its
    /// defaults) and tenant `acme` on it, whose members are group root's.
    pub fn minimal(name: &str, root: &Path) -> TenancyToml {
        let mut t = TenancyToml::under(name, root);
        t.tier("internal");
        t.tenant("acme").tier("internal").groups(["root"]);
        t
    }

    /// What the submit-path benchmarks (SPANK's and job_submit's) decide over, at a node's
    /// installed paths: tier `internal` (shares GPUs) and `regulated` (a GPU of its own, scratch
    /// retained 30 days), tenants `acme` (group root) and `globex` (group daemon), DNS and
    /// slurmctld as infrastructure.
    pub fn submit_bench() -> TenancyToml {
        let mut t = TenancyToml::new("bench");
        t.cluster()
            .state_dir("/var/lib/slurm-tenancy/jobs")
            .audit_log("/var/log/slurm-tenancy/audit.jsonl")
            .scratch_root("/scratch");
        t.tier("internal")
            .mig_profiles(["1g.18gb", "2g.35gb", "3g.71gb"]);
        t.tier("regulated")
            .mig_profiles(["3g.71gb"])
            .share_gpu(false)
            .scratch_on_exit(ScratchOnExit::Retain)
            .retain_days(30);
        t.tenant("acme")
            .tier("internal")
            .groups(["root"])
            .accounts(["acme"])
            .egress(["10.20.0.0/16:443/tcp"]);
        t.tenant("globex")
            .tier("regulated")
            .groups(["daemon"])
            .egress(["10.30.0.0/16:443/tcp"]);
        t.network()
            .infrastructure(["10.0.0.53/32:53/udp", "10.0.0.10/32:6817-6819/tcp"]);
        t
    }

    /// The NVML stand-in of a test root (what [`crate::nvml_fixture`] writes there): the
    /// `library`, root/fixture.toml, and the driver files it lays out in root.
    pub fn nvml_stand_in(&mut self, root: &Path, library: &Path) -> &mut TenancyToml {
        self.cluster()
            .nvml_library(library)
            .nvml_shim_fixture(root.join("fixture.toml"));
        self.node()
            .proc_devices(root.join("proc-devices"))
            .mig_minors(root.join("mig-minors"))
            .nvidia_caps_dir(root.join("dev/nvidia-caps"));
        self
    }

    pub fn cluster(&mut self) -> Cluster<'_> {
        Cluster(self.section("cluster".into()))
    }

    pub fn node(&mut self) -> Node<'_> {
        Node(self.section("node".into()))
    }

    pub fn network(&mut self) -> Network<'_> {
        Network(self.section("network".into()))
    }

    /// `[mig.plan.<model>]`: instances of each profile per GPU of that model.
    pub fn mig_plan(&mut self, model: &str) -> MigPlan<'_> {
        MigPlan(self.section(format!("mig.plan.{}", key(model))))
    }

    /// `[audit]`.
    pub fn audit(&mut self) -> Audit<'_> {
        Audit(self.section("audit".into()))
    }

    /// `[tiers.<name>]` (made empty on first use: every key has a default).
    pub fn tier(&mut self, name: &str) -> Tier<'_> {
        Tier(self.section(format!("tiers.{}", key(name))))
    }

    /// `[tenants.<name>]`.
    pub fn tenant(&mut self, name: &str) -> Tenant<'_> {
        Tenant(self.section(format!("tenants.{}", key(name))))
    }

    /// `[billing]`, its `[billing.rates]` right after it.
    pub fn billing(&mut self) -> Billing<'_> {
        self.section("billing".into());
        self.section("billing.rates".into());
        Billing(self)
    }

    fn section(&mut self, name: String) -> &mut Section {
        let i = match self.sections.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                self.sections.push(Section {
                    name,
                    keys: Vec::new(),
                });
                self.sections.len() - 1
            }
        };
        &mut self.sections[i]
    }
}

impl fmt::Display for TenancyToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.sections {
            // An empty rates table says nothing: left out.
            if s.name == "billing.rates" && s.keys.is_empty() {
                continue;
            }
            writeln!(f, "[{}]", s.name)?;
            for (k, v) in &s.keys {
                writeln!(f, "{k} = {v}")?;
            }
        }
        Ok(())
    }
}

impl Section {
    fn set(&mut self, k: &str, value: String) -> &mut Section {
        match self.keys.iter_mut().find(|(key, _)| key == k) {
            Some((_, v)) => *v = value,
            None => self.keys.push((k.to_string(), value)),
        }
        self
    }

    fn unset(&mut self, k: &str) {
        self.keys.retain(|(key, _)| key != k);
    }
}

/// A bare key where TOML allows one, else a quoted one.
fn key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if bare {
        k.to_string()
    } else {
        string(k)
    }
}

/// A TOML basic string.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn path(p: impl AsRef<Path>) -> String {
    string(&p.as_ref().display().to_string())
}

fn list(items: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let items: Vec<String> = items.into_iter().map(|s| string(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

fn boolean(b: bool) -> String {
    b.to_string()
}

fn number(n: u32) -> String {
    n.to_string()
}

fn inline_limits(l: Limits) -> String {
    let mut keys = Vec::new();
    if let Some(n) = l.gpus {
        keys.push(format!("gpus = {n}"));
    }
    if !l.mig_slices.is_empty() {
        let slices: Vec<String> = l
            .mig_slices
            .iter()
            .map(|(p, n)| format!("{} = {n}", string(p)))
            .collect();
        keys.push(format!("mig_slices = {{ {} }}", slices.join(", ")));
    }
    if let Some(n) = l.nodes {
        keys.push(format!("nodes = {n}"));
    }
    if let Some(n) = l.running_jobs {
        keys.push(format!("running_jobs = {n}"));
    }
    if keys.is_empty() {
        "{}".to_string()
    } else {
        format!("{{ {} }}", keys.join(", "))
    }
}

fn placement(p: GpuPlacement) -> String {
    string(match p {
        GpuPlacement::Node => "node",
        GpuPlacement::Gpu => "gpu",
    })
}

fn on_exit(s: ScratchOnExit) -> String {
    string(match s {
        ScratchOnExit::Wipe => "wipe",
        ScratchOnExit::Retain => "retain",
    })
}

/// Setters of one section: `$name(value)` sets key `$name`.
macro_rules! keys {
    ($ty:ident { $($(#[$m:meta])* $name:ident: $arg:ty => $render:path;)* }) => {
        impl $ty<'_> {
            $(
                $(#[$m])*
                pub fn $name(self, value: $arg) -> Self {
                    self.0.set(stringify!($name), $render(value));
                    self
                }
            )*

            /// Removes `key` from the section (it takes its default again).
            pub fn unset(self, key: &str) -> Self {
                self.0.unset(key);
                self
            }
        }
    };
}

/// `[cluster]`.
pub struct Cluster<'a>(&'a mut Section);
keys!(Cluster {
    name: &str => string;
    state_dir: impl AsRef<Path> => path;
    audit_log: impl AsRef<Path> => path;
    scratch_root: impl AsRef<Path> => path;
    nvml_library: impl AsRef<Path> => path;
    nvml_shim_fixture: impl AsRef<Path> => path;
    audit_anchor: impl AsRef<Path> => path;
    audit_anchor_key: impl AsRef<Path> => path;
    dcgm_job_mapping_dir: impl AsRef<Path> => path;
});

/// `[node]`.
pub struct Node<'a>(&'a mut Section);
keys!(Node {
    proc_devices: impl AsRef<Path> => path;
    mig_minors: impl AsRef<Path> => path;
    rdma_devices: impl AsRef<Path> => path;
    /// Where the prolog makes a job's nvidia-caps device nodes.
    nvidia_caps_dir: impl AsRef<Path> => path;
    /// Budget of one NVML call on the job path.
    nvml_timeout_ms: u32 => number;
    /// Slurm's squeue, which the prolog asks about other jobs' journals.
    squeue: impl AsRef<Path> => path;
});

/// `[network]`.
pub struct Network<'a>(&'a mut Section);
keys!(Network {
    /// Destinations every tenant may reach (`10.0.0.53/32:53/udp`).
    infrastructure: impl IntoIterator<Item = impl AsRef<str>> => list;
    node_network: &str => string;
});

/// `[audit]`.
pub struct Audit<'a>(&'a mut Section);
keys!(Audit {
    /// `host:port` of each syslog-over-TLS collector `tenancyctl audit forward` ships to.
    collectors: impl IntoIterator<Item = impl AsRef<str>> => list;
    /// The CA certificates a collector's certificate must chain to.
    ca_file: impl AsRef<Path> => path;
});

/// `[tiers.<name>]`.
pub struct Tier<'a>(&'a mut Section);
keys!(Tier {
    mig_profiles: impl IntoIterator<Item = impl AsRef<str>> => list;
    share_gpu: bool => boolean;
    share_node: bool => boolean;
    gpu_placement: GpuPlacement => placement;
    scratch_on_exit: ScratchOnExit => on_exit;
    retain_days: u32 => number;
    /// Octal, as the file writes it (`"0750"`).
    scratch_mode: &str => string;
    /// Cgroup syntax (`c 1:3 rwm`).
    device_classes: impl IntoIterator<Item = impl AsRef<str>> => list;
    allow_get_user_env: bool => boolean;
    /// `"required"` or `"off"`.
    scratch_encryption: &str => string;
    /// The default quota of the tier's tenants.
    limits: Limits => inline_limits;
    /// Every tenant of the tier must have limits.
    require_limits: bool => boolean;
    /// The tier's node pool, in Slurm's hostlist syntax (`gpu[01-04]`).
    nodes: &str => string;
});

/// `[tenants.<name>]`.
pub struct Tenant<'a>(&'a mut Section);
keys!(Tenant {
    tier: &str => string;
    groups: impl IntoIterator<Item = impl AsRef<str>> => list;
    accounts: impl IntoIterator<Item = impl AsRef<str>> => list;
    /// Destinations (`10.20.0.0/16:443/tcp`).
    egress: impl IntoIterator<Item = impl AsRef<str>> => list;
    address_prefix: &str => string;
    /// The tenant's quota, over its tier's key by key.
    limits: Limits => inline_limits;
    /// The tenant's own node pool, in place of its tier's (`gpu05`).
    nodes: &str => string;
});

/// `[mig.plan.<model>]`.
pub struct MigPlan<'a>(&'a mut Section);
impl MigPlan<'_> {
    /// `"<profile>" = n`.
    pub fn instances(self, profile: &str, n: u32) -> Self {
        self.0.set(&string(profile), n.to_string());
        self
    }
}

/// `[billing]` and `[billing.rates]`. Prices are TOML values as the file writes them (`0.85`,
/// `2_000.005`, or a quoted decimal `"2.40"`): the config reads decimals from the text.
pub struct Billing<'a>(&'a mut TenancyToml);
impl Billing<'_> {
    pub fn currency(self, code: &str) -> Self {
        self.0
            .section("billing".into())
            .set("currency", string(code));
        self
    }

    pub fn job_hour_without_mig(self, price: &str) -> Self {
        self.0
            .section("billing".into())
            .set("job_hour_without_mig", price.to_string());
        self
    }

    /// `"<profile>" = price` in `[billing.rates]`.
    pub fn rate(self, profile: &str, price: &str) -> Self {
        self.0
            .section("billing.rates".into())
            .set(&string(profile), price.to_string());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_sections_and_keys_in_the_order_they_were_set() {
        let mut c = TenancyToml::under("t", Path::new("/r"));
        c.tier("internal")
            .mig_profiles(["1g.18gb"])
            .scratch_on_exit(ScratchOnExit::Retain);
        c.tenant("acme").tier("internal").groups(["root", "x\"y"]);
        c.tier("internal").retain_days(2).mig_profiles(["3g.71gb"]);
        c.billing()
            .currency("EUR")
            .job_hour_without_mig("0.10")
            .rate("1g.18gb", "0.85");
        c.mig_plan("H200-141GB").instances("1g.18gb", 4);
        assert_eq!(
            c.to_string(),
            "[cluster]\nname = \"t\"\nstate_dir = \"/r/state\"\naudit_log = \"/r/audit.jsonl\"\n\
             scratch_root = \"/r/scratch\"\n[tiers.internal]\nmig_profiles = [\"3g.71gb\"]\n\
             scratch_on_exit = \"retain\"\nretain_days = 2\n[tenants.acme]\ntier = \"internal\"\n\
             groups = [\"root\", \"x\\\"y\"]\n[billing]\ncurrency = \"EUR\"\n\
             job_hour_without_mig = 0.10\n[billing.rates]\n\"1g.18gb\" = 0.85\n\
             [mig.plan.H200-141GB]\n\"1g.18gb\" = 4\n"
        );
    }

    #[test]
    fn limits_are_an_inline_table_in_the_configs_key_order() {
        let mut c = TenancyToml::new("t");
        c.tier("regulated")
            .require_limits(true)
            .limits(Limits::default().running_jobs(20).gpus(8))
            .nodes("gpu[01-04]");
        c.tenant("globex").nodes("gpu05").limits(
            Limits::default()
                .mig_slices("3g.71gb", 1)
                .nodes(2)
                .mig_slices("7g.141gb", 1)
                .mig_slices("3g.71gb", 2),
        );
        c.tenant("acme").limits(Limits::default());
        assert_eq!(
            c.to_string(),
            "[cluster]\nname = \"t\"\n[tiers.regulated]\nrequire_limits = true\n\
             limits = { gpus = 8, running_jobs = 20 }\nnodes = \"gpu[01-04]\"\n\
             [tenants.globex]\nnodes = \"gpu05\"\n\
             limits = { mig_slices = { \"3g.71gb\" = 2, \"7g.141gb\" = 1 }, nodes = 2 }\n\
             [tenants.acme]\nlimits = {}\n"
        );
    }

    #[test]
    fn an_unset_key_is_gone() {
        let mut c = TenancyToml::new("t");
        c.network()
            .infrastructure(["10.0.0.1/32"])
            .node_network("10.0.0.0/24");
        c.network().unset("node_network");
        assert_eq!(
            c.to_string(),
            "[cluster]\nname = \"t\"\n[network]\ninfrastructure = [\"10.0.0.1/32\"]\n"
        );
    }
}
