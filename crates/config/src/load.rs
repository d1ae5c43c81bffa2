//! Loading: finding the config file, parsing it with spans, and the [`Validator`] that turns
//! the raw form into a [`Config`] or names every problem at once.

use crate::{billing, slurm_conf, Billing, Decimal, Destination, Limits};
use crate::{valid_device_class, valid_name, valid_profile, valid_unix_name};
use crate::{Audit, Cluster, Collector, Config, NodePaths, ScratchEncryption, Tenant, Tier};
use crate::{ConfigError, Ipv4Net, Problem, Validator};
use crate::{Raw, RawAudit, RawCluster, RawMig, RawNetwork, RawNode, RawTenant, RawTier};
use crate::{DEFAULT_AUDIT_RETAIN_DAYS, DEFAULT_NVML_TIMEOUT_MS, DEFAULT_PATH};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

impl Config {
    /// Finds and loads the config: `explicit`, then `TENANCY_CONFIG`, then `tenancy.toml` in the
    /// folder of `SLURM_CONF`, then [`DEFAULT_PATH`].
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        Self::from_file(&Self::find(explicit)?)
    }

    /// The path [`Self::load`] reads.
    pub fn find(explicit: Option<&Path>) -> Result<PathBuf, ConfigError> {
        Self::locate(
            explicit,
            std::env::var_os("TENANCY_CONFIG").map(PathBuf::from),
            std::env::var_os("SLURM_CONF").map(PathBuf::from),
        )
    }

    /// The search order, without touching the environment (testable).
    pub fn locate(
        explicit: Option<&Path>,
        tenancy_config: Option<PathBuf>,
        slurm_conf: Option<PathBuf>,
    ) -> Result<PathBuf, ConfigError> {
        if let Some(p) = explicit {
            return Ok(p.to_path_buf());
        }
        if let Some(p) = tenancy_config.filter(|p| !p.as_os_str().is_empty()) {
            return Ok(p);
        }
        let mut tried = Vec::new();
        if let Some(dir) = slurm_conf.as_deref().and_then(Path::parent) {
            let p = dir.join("tenancy.toml");
            if p.exists() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
        let p = PathBuf::from(DEFAULT_PATH);
        if p.exists() {
            return Ok(p);
        }
        tried.push(DEFAULT_PATH.to_string());
        Err(ConfigError::NotFound {
            tried: tried.join(", "),
        })
    }

    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text`; `path` is used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Self::parse_for(text, path, None)
    }

    /// [`Self::parse`], and every node pool checked against the nodes of `slurm` (slurm.conf):
    /// a pool naming a node Slurm does not have is a located problem like any other.
    pub fn parse_for(
        text: &str,
        path: &Path,
        slurm: Option<&slurm_conf::SlurmConf>,
    ) -> Result<Config, ConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let message = e.message().trim_end().to_string();
            ConfigError::Invalid(vec![Problem::at(path, text, e.span(), message)])
        })?;
        Validator {
            path,
            text,
            problems: Vec::new(),
            slurm,
        }
        .run(raw)
    }

    /// [`Self::from_file`] checked against slurm.conf's nodes ([`Self::parse_for`]).
    pub fn from_file_for(
        path: &Path,
        slurm: Option<&slurm_conf::SlurmConf>,
    ) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_for(&text, path, slurm)
    }

    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.get(name)
    }

    /// Days the records of a job of `tier` are kept: `[audit] retain_days`, or the tier's
    /// `audit_retain_days` when longer.
    pub fn audit_retain_days(&self, tier: Option<&str>) -> u32 {
        let t = tier
            .and_then(|t| self.tiers.get(t))
            .and_then(|t| t.audit_retain_days);
        t.unwrap_or(0).max(self.audit.retain_days)
    }

    pub fn tier_of(&self, tenant: &Tenant) -> &Tier {
        // Validation guarantees every tenant's tier exists.
        &self.tiers[&tenant.tier]
    }
}

impl Validator<'_> {
    pub(crate) fn problem<T>(&mut self, at: &Spanned<T>, message: String) {
        self.problems
            .push(Problem::at(self.path, self.text, Some(at.span()), message));
    }

    fn abs_path(&mut self, p: &Spanned<PathBuf>, key: &str) -> PathBuf {
        if !p.get_ref().is_absolute() {
            self.problem(
                p,
                format!(
                    "{key} must be an absolute path, found '{}'",
                    p.get_ref().display()
                ),
            );
        } else if p
            .get_ref()
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            self.problem(p, format!("{key} must not contain '..'"));
        }
        p.get_ref().clone()
    }

    fn name(&mut self, n: &Spanned<String>, what: &str) -> String {
        if !valid_name(n.get_ref()) {
            self.problem(
                n,
                format!(
                    "bad {what} name '{}': use 1 to 32 lowercase letters, digits, '-' or '_'",
                    n.get_ref()
                ),
            );
        }
        n.get_ref().clone()
    }

    /// Tenant prefixes must not overlap each other or the node network, and must hold an
    /// address for every node (a length no longer than node_network's).
    fn cross_node_overlaps(&mut self, nn: Ipv4Net, tenants: &BTreeMap<Spanned<String>, RawTenant>) {
        let mut seen: Vec<(String, Ipv4Net)> = Vec::new();
        for (name, t) in tenants {
            let Some(p) = &t.address_prefix else { continue };
            let Ok(net) = Ipv4Net::parse(p.get_ref()) else {
                continue;
            };
            let name = name.get_ref();
            if net.overlaps(&nn) {
                self.problem(
                    p,
                    format!("tenant '{name}': address_prefix {net} overlaps node_network {nn}"),
                );
            } else if net.len > nn.len {
                self.problem(
                    p,
                    format!(
                        "tenant '{name}': address_prefix {net} holds fewer addresses than \
                         node_network {nn} has nodes: make it /{} or larger",
                        nn.len
                    ),
                );
            }
            if let Some((o, q)) = seen.iter().find(|(_, q)| q.overlaps(&net)) {
                let msg =
                    format!("tenants '{o}' and '{name}': address prefixes {q} and {net} overlap");
                self.problem(p, msg);
            }
            seen.push((name.clone(), net));
        }
    }

    fn destinations(&mut self, list: &[Spanned<String>]) -> Vec<Destination> {
        let mut out = Vec::new();
        for d in list {
            match Destination::parse(d.get_ref()) {
                Ok(dest) => out.push(dest),
                Err(e) => self.problem(d, e.to_string()),
            }
        }
        out
    }

    /// `[audit]`: collector addresses that parse, a CA to check them with, a client
    /// certificate with its key or neither, and a retention no tier undercuts.
    fn audit(
        &mut self,
        a: &RawAudit,
        cluster: &Cluster,
        tiers: &BTreeMap<Spanned<String>, RawTier>,
    ) -> Audit {
        let mut collectors = Vec::new();
        for c in &a.collectors {
            match Collector::parse(c.get_ref()) {
                Ok(c) => collectors.push(c),
                Err(e) => self.problem(c, format!("audit.collectors: {e}")),
            }
        }
        let path = |v: &mut Self, p: &Option<Spanned<PathBuf>>, key: &str| {
            p.as_ref().map(|p| v.abs_path(p, key))
        };
        let signing_key = path(self, &a.signing_key, "audit.signing_key")
            .unwrap_or_else(|| cluster.state_dir.join("audit-signing.key"));
        let public_keys = path(self, &a.public_keys, "audit.public_keys");
        let ca_file = path(self, &a.ca_file, "audit.ca_file");
        let cert_file = path(self, &a.cert_file, "audit.cert_file");
        let key_file = path(self, &a.key_file, "audit.key_file");
        if let (Some(first), None) = (a.collectors.first(), &a.ca_file) {
            self.problem(
                first,
                "audit.collectors: set audit.ca_file too, the CA certificates (PEM) the \
                 collectors' certificates must chain to: records never go out unchecked"
                    .to_string(),
            );
        }
        if let (Some(first), None) = (a.collectors.first(), &cluster.audit_anchor) {
            self.problem(
                first,
                "audit.collectors: the forwarder ships the anchors from cluster.audit_anchor: \
                 set it too (e.g. \"/var/log/slurm-tenancy/anchors.log\")"
                    .to_string(),
            );
        }
        match (&a.cert_file, &a.key_file) {
            (Some(c), None) => self.problem(c, "audit.cert_file without audit.key_file".into()),
            (None, Some(k)) => self.problem(k, "audit.key_file without audit.cert_file".into()),
            _ => {}
        }
        let retain_days = a
            .retain_days
            .as_ref()
            .map_or(DEFAULT_AUDIT_RETAIN_DAYS, |d| *d.get_ref());
        if let Some(d) = a.retain_days.as_ref().filter(|d| *d.get_ref() == 0) {
            self.problem(
                d,
                "audit.retain_days = 0 would let prune remove every rotated file at once; \
                 PCI DSS asks for 365"
                    .into(),
            );
        }
        for (name, t) in tiers {
            if t.audit_retain_days.is_some_and(|d| d < retain_days) {
                let msg = format!(
                    "tiers.{}.audit_retain_days is shorter than audit.retain_days ({retain_days}): \
                     a tier may require more, never less",
                    name.get_ref()
                );
                self.problem(name, msg);
            }
        }
        Audit {
            signing_key,
            public_keys,
            collectors,
            ca_file,
            cert_file,
            key_file,
            retain_days,
        }
    }

    /// `[billing]`: a known currency code, a price for every profile a tier offers (a job of it
    /// is never free by omission) and for jobs without a MIG slice, no price negative.
    fn billing(
        &mut self,
        b: &billing::RawBilling,
        tiers: &BTreeMap<Spanned<String>, RawTier>,
    ) -> Billing {
        if !billing::valid_currency(b.currency.get_ref()) {
            let msg = format!(
                "billing.currency '{}': write the ISO 4217 code, three capital letters like \
                 \"EUR\" or \"USD\"",
                b.currency.get_ref()
            );
            self.problem(&b.currency, msg);
        }
        let mut rates = BTreeMap::new();
        for (profile, value) in &b.rates {
            let key = format!("billing.rates.\"{}\"", profile.get_ref());
            if !valid_profile(profile.get_ref()) {
                self.problem(
                    profile,
                    format!(
                        "{key}: '{}' is not a MIG profile; write it as NVML names it, e.g. \
                         1g.18gb or 3g.71gb",
                        profile.get_ref()
                    ),
                );
            }
            match billing::parse_rate(value, self.text, &key) {
                Ok(d) => {
                    rates.insert(profile.get_ref().clone(), d);
                }
                Err(e) => self.problem(value, e),
            }
        }
        let job_hour_without_mig = match &b.job_hour_without_mig {
            Some(v) => billing::parse_rate(v, self.text, "billing.job_hour_without_mig")
                .unwrap_or_else(|e| {
                    self.problem(v, e);
                    Decimal::ZERO
                }),
            None => {
                self.problem(
                    &b.currency,
                    "[billing] has no job_hour_without_mig: jobs without a MIG slice would be \
                     free by omission; set their price per job-hour (0 if they are free)"
                        .to_string(),
                );
                Decimal::ZERO
            }
        };
        for (tier, t) in tiers {
            for p in &t.mig_profiles {
                if !b.rates.keys().any(|k| k.get_ref() == p.get_ref()) {
                    let msg = format!(
                        "[billing.rates] has no price for profile '{}', which tier '{}' \
                         offers: its jobs would be free by omission; add \"{}\" = <price per \
                         slice-hour> under [billing.rates]",
                        p.get_ref(),
                        tier.get_ref(),
                        p.get_ref()
                    );
                    self.problem(p, msg);
                }
            }
        }
        Billing {
            currency: b.currency.get_ref().clone(),
            rates,
            job_hour_without_mig,
        }
    }

    fn run(mut self, raw: Raw) -> Result<Config, ConfigError> {
        let cluster = self.cluster(&raw.cluster);
        let node = self.node(&raw.node);
        let tiers = self.tiers(&raw.tiers);
        let tenants = self.tenants(&raw, &tiers);
        let infrastructure = self.destinations(&raw.network.infrastructure);
        let node_network = raw.network.node_network.as_ref().and_then(|n| {
            Ipv4Net::parse(n.get_ref())
                .map_err(|e| self.problem(n, format!("network.node_network {e}")))
                .ok()
        });
        if let Some(nn) = node_network {
            self.cross_node_overlaps(nn, &raw.tenants);
        }
        let mig_plan = self.mig_plan(&raw.mig);

        let billing = raw.billing.as_ref().map(|b| self.billing(b, &raw.tiers));
        let audit = self.audit(&raw.audit, &cluster, &raw.tiers);
        self.limit_accounts(&raw.tenants, &tenants);

        if self.problems.is_empty() {
            Ok(Config {
                path: self.path.to_path_buf(),
                cluster,
                node,
                audit,
                tiers,
                tenants,
                infrastructure,
                node_network,
                mig_plan,
                billing,
            })
        } else {
            Err(ConfigError::Invalid(self.problems))
        }
    }

    /// `[cluster]`: the cluster's name and the product's absolute paths.
    fn cluster(&mut self, c: &RawCluster) -> Cluster {
        if !valid_name(c.name.get_ref()) {
            let msg = format!(
                "bad cluster name '{}': use 1 to 32 lowercase letters, digits, '-' or '_'",
                c.name.get_ref()
            );
            self.problem(&c.name, msg);
        }
        Cluster {
            name: c.name.get_ref().clone(),
            state_dir: self.abs_path(&c.state_dir, "cluster.state_dir"),
            audit_log: self.abs_path(&c.audit_log, "cluster.audit_log"),
            scratch_root: self.abs_path(&c.scratch_root, "cluster.scratch_root"),
            nvml_library: c
                .nvml_library
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.nvml_library")),
            nvml_shim_fixture: c
                .nvml_shim_fixture
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.nvml_shim_fixture")),
            audit_anchor: c
                .audit_anchor
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.audit_anchor")),
            audit_anchor_key: c
                .audit_anchor_key
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.audit_anchor_key")),
            dcgm_job_mapping_dir: c
                .dcgm_job_mapping_dir
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.dcgm_job_mapping_dir")),
        }
    }

    /// `[node]`: where this node's driver files are, each with its default.
    fn node(&mut self, n: &RawNode) -> NodePaths {
        let mut node_path = |p: &Option<Spanned<PathBuf>>, key: &str, default: &str| match p {
            Some(p) => self.abs_path(p, key),
            None => PathBuf::from(default),
        };
        let node = NodePaths {
            proc_devices: node_path(&n.proc_devices, "node.proc_devices", "/proc/devices"),
            mig_minors: node_path(
                &n.mig_minors,
                "node.mig_minors",
                "/proc/driver/nvidia-caps/mig-minors",
            ),
            rdma_devices: node_path(&n.rdma_devices, "node.rdma_devices", "/dev/infiniband"),
            nvidia_caps_dir: node_path(
                &n.nvidia_caps_dir,
                "node.nvidia_caps_dir",
                "/dev/nvidia-caps",
            ),
            nvml_timeout_ms: DEFAULT_NVML_TIMEOUT_MS,
            squeue: node_path(&n.squeue, "node.squeue", "/usr/bin/squeue"),
        };
        let mut node = node;
        if let Some(t) = &n.nvml_timeout_ms {
            if *t.get_ref() == 0 || *t.get_ref() > 3_600_000 {
                self.problem(
                    t,
                    format!(
                        "node.nvml_timeout_ms = {}: give 1 to 3600000 milliseconds",
                        t.get_ref()
                    ),
                );
            }
            node.nvml_timeout_ms = *t.get_ref();
        }
        node
    }

    /// `[tiers]`: each tier, then the tier defaults of `[tiers.NAME.limits]`.
    fn tiers(&mut self, raw: &BTreeMap<Spanned<String>, RawTier>) -> BTreeMap<String, Tier> {
        let mut tiers = BTreeMap::new();
        for (name, t) in raw {
            let tier = self.tier(name, t);
            tiers.insert(tier.name.clone(), tier);
        }
        // The tier defaults, once every tier's profiles are known.
        for (name, t) in raw {
            if let Some(l) = &t.limits {
                let offered = tiers
                    .get(name.get_ref())
                    .map(|t: &Tier| t.mig_profiles.clone())
                    .unwrap_or_default();
                let limits = self.limits(
                    l,
                    &format!("tier '{}'", name.get_ref()),
                    name.get_ref(),
                    &offered,
                );
                if let Some(t) = tiers.get_mut(name.get_ref()) {
                    t.limits = limits;
                }
            }
        }
        tiers
    }

    /// One `[tiers.NAME]`: its MIG profiles, scratch policy, device classes and node pool.
    fn tier(&mut self, name: &Spanned<String>, t: &RawTier) -> Tier {
        let name = self.name(name, "tier");
        let mut profiles = Vec::new();
        for p in &t.mig_profiles {
            if !valid_profile(p.get_ref()) {
                self.problem(
                    p,
                    format!(
                        "bad MIG profile '{}': write it as NVML names it, e.g. 1g.18gb or 3g.71gb",
                        p.get_ref()
                    ),
                );
            }
            profiles.push(p.get_ref().clone());
        }
        let scratch_mode = match &t.scratch_mode {
            None => 0o700,
            Some(m) => match u32::from_str_radix(m.get_ref(), 8) {
                Ok(mode) if mode & !0o770 == 0 && mode & 0o700 == 0o700 => mode,
                _ => {
                    self.problem(
                        m,
                        format!(
                            "bad scratch_mode '{}': an octal mode like \"0700\" or \"0750\"; \
                             the owner needs rwx and others get nothing",
                            m.get_ref()
                        ),
                    );
                    0o700
                }
            },
        };
        let scratch_encryption = match &t.scratch_encryption {
            None => ScratchEncryption::Off,
            Some(e) => match e.get_ref().as_str() {
                "off" => ScratchEncryption::Off,
                "required" => ScratchEncryption::Required,
                other => {
                    self.problem(
                        e,
                        format!(
                            "bad scratch_encryption '{other}' for tier '{name}': \"required\" \
                             (each job folder encrypted with a key of its own, fscrypt; \
                             docs/encrypted-scratch.md) or \"off\""
                        ),
                    );
                    ScratchEncryption::Off
                }
            },
        };
        let mut classes = Vec::new();
        for d in &t.device_classes {
            if let Err(why) = valid_device_class(d.get_ref()) {
                self.problem(
                    d,
                    format!(
                        "bad device class '{}': {why}; write 'c MAJOR:MINOR ACCESS' like \
                         'c 1:3 rwm' (MINOR may be *)",
                        d.get_ref()
                    ),
                );
            }
            classes.push(d.get_ref().clone());
        }
        let pool = self.pool(&t.nodes, &format!("tier '{name}'"));
        Tier {
            name,
            mig_profiles: profiles,
            share_gpu: t.share_gpu,
            share_node: t.share_node,
            gpu_placement: t.gpu_placement,
            scratch_on_exit: t.scratch_on_exit,
            retain_days: t.retain_days,
            scratch_mode,
            scratch_encryption,
            device_classes: classes,
            allow_get_user_env: t.allow_get_user_env,
            audit_retain_days: t.audit_retain_days,
            limits: Limits::default(),
            require_limits: t.require_limits,
            nodes: pool,
        }
    }

    /// `[tenants]`: each tenant, its groups and accounts claimed by it alone.
    fn tenants(&mut self, raw: &Raw, tiers: &BTreeMap<String, Tier>) -> BTreeMap<String, Tenant> {
        let mut tenants = BTreeMap::new();
        let mut group_owner: BTreeMap<String, String> = BTreeMap::new();
        let mut account_owner: BTreeMap<String, String> = BTreeMap::new();
        for (name, t) in &raw.tenants {
            let owners = (&mut group_owner, &mut account_owner);
            let tenant = self.tenant(name, t, &raw.network, tiers, owners);
            tenants.insert(tenant.name.clone(), tenant);
        }
        tenants
    }

    /// One `[tenants.NAME]`: its tier, members, egress, address prefix, limits and node pool.
    fn tenant(
        &mut self,
        name: &Spanned<String>,
        t: &RawTenant,
        network: &RawNetwork,
        tiers: &BTreeMap<String, Tier>,
        owners: (&mut BTreeMap<String, String>, &mut BTreeMap<String, String>),
    ) -> Tenant {
        let name = self.name(name, "tenant");
        if !tiers.contains_key(t.tier.get_ref()) {
            let known: Vec<&str> = tiers.keys().map(String::as_str).collect();
            let msg = format!(
                "tenant '{name}' has unknown tier '{}' (known tiers: {})",
                t.tier.get_ref(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
            self.problem(&t.tier, msg);
        }
        if t.groups.is_empty() {
            let msg = format!(
                "tenant '{name}' has no groups: nobody could run jobs for it (add groups = [\"...\"])"
            );
            self.problem(&t.tier, msg);
        }
        self.members(&name, t, owners.0, owners.1);
        let egress = self.destinations(&t.egress);
        let address_prefix = t.address_prefix.as_ref().and_then(|p| {
            let net = Ipv4Net::parse(p.get_ref())
                .map_err(|e| self.problem(p, format!("tenant '{name}': address_prefix {e}")))
                .ok()?;
            if network.node_network.is_none() {
                let msg = format!(
                    "tenant '{name}' has an address_prefix but [network] has no \
                     node_network: set node_network (the nodes' own addresses) too"
                );
                self.problem(p, msg);
            }
            Some(net)
        });
        if network.node_network.is_some() && t.address_prefix.is_none() {
            let msg = format!(
                "tenant '{name}' has no address_prefix: with [network] node_network every \
                 tenant needs its own (e.g. address_prefix = \"10.64.1.0/24\")"
            );
            self.problem(&t.tier, msg);
        }
        let tier = tiers.get(t.tier.get_ref());
        let own = t.limits.as_ref().map(|l| {
            let offered = tier.map(|t| t.mig_profiles.clone()).unwrap_or_default();
            self.limits(l, &format!("tenant '{name}'"), t.tier.get_ref(), &offered)
        });
        let limits = tier
            .map(|t| t.limits.clone())
            .unwrap_or_default()
            .overridden_by(own.as_ref());
        if tier.is_some_and(|t| t.require_limits) && limits.is_empty() {
            let msg = format!(
                "tenant '{name}' has no limits, and its tier '{}' has require_limits = true: \
                 give it [tenants.{name}.limits] (or the tier [tiers.{}.limits]), e.g. gpus = 8",
                t.tier.get_ref(),
                t.tier.get_ref()
            );
            self.problem(&t.tier, msg);
        }
        let nodes = self.pool(&t.nodes, &format!("tenant '{name}'"));
        Tenant {
            name,
            tier: t.tier.get_ref().clone(),
            groups: t.groups.iter().map(|g| g.get_ref().clone()).collect(),
            accounts: t.accounts.iter().map(|a| a.get_ref().clone()).collect(),
            egress,
            address_prefix,
            limits,
            nodes,
        }
    }

    /// A tenant's groups and accounts: valid names, each claimed by one tenant alone
    /// (`group_owner`, `account_owner`: the tenants seen so far).
    fn members(
        &mut self,
        name: &str,
        t: &RawTenant,
        group_owner: &mut BTreeMap<String, String>,
        account_owner: &mut BTreeMap<String, String>,
    ) {
        for g in &t.groups {
            if !valid_unix_name(g.get_ref()) {
                self.problem(g, format!("bad group name '{}'", g.get_ref()));
            } else if let Some(other) = group_owner.get(g.get_ref()) {
                let msg = format!(
                    "group '{}' is claimed by tenants '{other}' and '{name}': a group belongs \
                     to one tenant",
                    g.get_ref()
                );
                self.problem(g, msg);
            } else {
                group_owner.insert(g.get_ref().clone(), name.to_string());
            }
        }
        for a in &t.accounts {
            if !valid_unix_name(a.get_ref()) {
                self.problem(a, format!("bad Slurm account name '{}'", a.get_ref()));
            } else if let Some(other) = account_owner.get(a.get_ref()) {
                let msg = format!(
                    "account '{}' is claimed by tenants '{other}' and '{name}': an account \
                     maps to one tenant",
                    a.get_ref()
                );
                self.problem(a, msg);
            } else {
                account_owner.insert(a.get_ref().clone(), name.to_string());
            }
        }
    }

    /// `[mig.plan]`: per GPU model, how many slices of each profile to lay out.
    fn mig_plan(&mut self, mig: &RawMig) -> BTreeMap<String, BTreeMap<String, u32>> {
        let mut mig_plan = BTreeMap::new();
        for (model, profiles) in &mig.plan {
            let mut per = BTreeMap::new();
            for (p, n) in profiles {
                if !valid_profile(p.get_ref()) {
                    self.problem(p, format!("bad MIG profile '{}' in mig.plan", p.get_ref()));
                }
                per.insert(p.get_ref().clone(), *n);
            }
            mig_plan.insert(model.get_ref().clone(), per);
        }
        mig_plan
    }
}
