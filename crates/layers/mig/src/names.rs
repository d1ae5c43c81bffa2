//! Profile names as the node's driver reports them, against the names the config uses.
//!
//! The product places a slice by GPU instance profile id, from its own table, so a driver that
//! names a profile otherwise still gets the right instance. But the names are what admins
//! write (tiers, the plan, `--mig`) and what other tools show: driver 535 called the
//! A100-80GB's 3g.40gb "3g.39gb", and Slurm's AutoDetect=nvml, which names GRES types after
//! the driver, then dropped the configured 3g.40gb type (NVIDIA/mig-parted issue 31). So
//! `tenancyctl check` and `doctor` say when a configured name is not the driver's.

use crate::profiles::GpuModel;

/// One GPU's profiles as its driver names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverNames {
    pub gpu: u32,
    /// NVML's device name ("NVIDIA A100-SXM4-80GB").
    pub gpu_name: String,
    pub model: GpuModel,
    /// (GPU instance profile id, name without "MIG "), in the driver's order.
    pub names: Vec<(u32, String)>,
}

/// A configured name and where the config uses it ("tier internal", "mig plan A100-80GB").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    pub name: String,
    pub used_in: String,
}

/// What is wrong with the configured names on this node, one message each (empty: nothing).
pub fn mismatches(configured: &[Configured], node: &[DriverNames], driver: &str) -> Vec<String> {
    let mut out = Vec::new();
    for c in configured {
        let mut known_here = false;
        for g in node {
            let reported: Vec<&str> = g.names.iter().map(|(_, n)| n.as_str()).collect();
            let Some(p) = g.model.profile(&c.name) else {
                continue;
            };
            known_here = true;
            let Some((_, theirs)) = g.names.iter().find(|(id, _)| *id == p.gi_profile_id) else {
                out.push(format!(
                    "MIG profile {} ({}) is GPU instance profile id {} of a {}, which the \
                     driver {driver} on GPU {} ({}) does not offer; it reports {}",
                    c.name,
                    c.used_in,
                    p.gi_profile_id,
                    g.model,
                    g.gpu,
                    g.gpu_name,
                    reported.join(", ")
                ));
                continue;
            };
            if !theirs.eq_ignore_ascii_case(p.name) {
                out.push(format!(
                    "MIG profile {} ({}) is not a name the driver {driver} on GPU {} ({}) \
                     reports: it calls GPU instance profile id {} \"{theirs}\" and reports {}. \
                     Slices of {} are still made (the product places by profile id), but \
                     tools that take the driver's names (Slurm's AutoDetect=nvml GRES types, \
                     nvidia-smi, DCGM) show {theirs}",
                    c.name,
                    c.used_in,
                    g.gpu,
                    g.gpu_name,
                    p.gi_profile_id,
                    reported.join(", "),
                    c.name
                ));
            }
        }
        if known_here {
            continue;
        }
        // Not a name of any model here: a driver's own name the product's table spells
        // otherwise is worth saying; names of other nodes' models are not.
        for g in node {
            if let Some((id, theirs)) = g
                .names
                .iter()
                .find(|(_, n)| n.eq_ignore_ascii_case(&c.name))
            {
                let ours = g.model.profile_by_gi_id(*id).map(|p| p.name).unwrap_or("?");
                out.push(format!(
                    "MIG profile {} ({}) is the driver {driver}'s name for GPU instance \
                     profile id {id} on GPU {} ({}), which the product's {} table calls {ours}: \
                     write {ours} ({theirs} is refused at submission)",
                    c.name, c.used_in, g.gpu, g.gpu_name, g.model
                ));
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100_535() -> DriverNames {
        DriverNames {
            gpu: 0,
            gpu_name: "NVIDIA A100-SXM4-80GB".into(),
            model: GpuModel::A100_80GB,
            names: [
                (19, "1g.10gb"),
                (14, "2g.20gb"),
                (9, "3g.39gb"),
                (5, "4g.40gb"),
                (0, "7g.80gb"),
                (20, "1g.10gb+me"),
                (15, "1g.20gb"),
            ]
            .map(|(i, n)| (i, n.to_string()))
            .into(),
        }
    }

    fn conf(name: &str) -> Configured {
        Configured {
            name: name.into(),
            used_in: "tier internal".into(),
        }
    }

    #[test]
    fn a_renamed_profile_is_named_with_what_the_driver_reports() {
        let node = [a100_535()];
        let m = mismatches(
            &[conf("3g.40gb"), conf("1g.10gb"), conf("3g.71gb")],
            &node,
            "535.129.03",
        );
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("3g.40gb") && m[0].contains("\"3g.39gb\""),
            "{}",
            m[0]
        );
        assert!(
            m[0].contains("535.129.03") && m[0].contains("tier internal"),
            "{}",
            m[0]
        );
        assert!(m[0].contains("1g.10gb, 2g.20gb, 3g.39gb"), "{}", m[0]);
        // The driver's spelling in the config: told to write the product's.
        let m = mismatches(&[conf("3g.39gb")], &node, "535.129.03");
        assert_eq!(m.len(), 1);
        assert!(m[0].contains("write 3g.40gb"), "{}", m[0]);
        // Names that match: nothing to say.
        let mut current = a100_535();
        current.names[2].1 = "3g.40gb".into();
        assert!(mismatches(&[conf("3g.40gb")], &[current], "570.124.06").is_empty());
    }
}
