//! Slurm's hostlist syntax (`gpu[01-04,07],login1`, `rack[1-2]n[1-8]`): the node pools of
//! tiers and tenants (`nodes = "gpu[01-04]"`), parsed into ranges so that "is this node in the
//! pool" costs the same for 4 nodes or 4,000 (the prolog asks it for every job), and
//! compressed back into that syntax for the node lists slurmctld takes (`exc_nodes`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Most names one hostlist may stand for (Slurm's own limit is 64k nodes per hostlist).
pub const MAX_HOSTS: u64 = 65_536;

/// One part of a host name pattern: literal text, or a bracket of numeric ranges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Part {
    Text(String),
    /// `(low, high, width)`: `01-04` is (1, 4, 2); `8-10` is (8, 10, 1), unpadded.
    Ranges(Vec<(u64, u64, usize)>),
}

/// A parsed hostlist: the text as written and the patterns it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hostlist {
    pub text: String,
    patterns: Vec<Vec<Part>>,
}

impl fmt::Display for Hostlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Splits at commas outside brackets.
fn top_level_items(s: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("a '[' inside brackets".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a ']' without its '['".into()),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '[' without its ']'".into());
    }
    out.push(&s[start..]);
    Ok(out)
}

fn number(s: &str) -> Result<u64, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
        return Err(format!("'{s}' is not a number"));
    }
    s.parse().map_err(|_| format!("'{s}' is not a number"))
}

fn ranges(inner: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    let mut out = Vec::new();
    for r in inner.split(',') {
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let (l, h) = (number(lo.trim())?, number(hi.trim())?);
        if l > h {
            return Err(format!("range '{r}' runs backwards"));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            1
        };
        out.push((l, h, width));
    }
    Ok(out)
}

fn pattern(item: &str) -> Result<Vec<Part>, String> {
    if item.is_empty() {
        return Err("an empty name (two commas in a row, or a comma at an end)".into());
    }
    let mut parts = Vec::new();
    let mut rest = item;
    while !rest.is_empty() {
        match rest.find('[') {
            Some(0) => {
                let end = rest.find(']').ok_or("a '[' without its ']'")?;
                parts.push(Part::Ranges(ranges(&rest[1..end])?));
                rest = &rest[end + 1..];
            }
            Some(i) => {
                parts.push(Part::Text(rest[..i].to_string()));
                rest = &rest[i..];
            }
            None => {
                parts.push(Part::Text(rest.to_string()));
                rest = "";
            }
        }
    }
    for p in &parts {
        if let Part::Text(t) = p {
            if let Some(c) = t
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
            {
                return Err(format!("'{c}' cannot be part of a node name"));
            }
        }
    }
    Ok(parts)
}

fn count(parts: &[Part]) -> u64 {
    parts
        .iter()
        .map(|p| match p {
            Part::Text(_) => 1,
            Part::Ranges(r) => r.iter().map(|(l, h, _)| h - l + 1).sum(),
        })
        .fold(1u64, |a, b| a.saturating_mul(b))
}

fn matches(parts: &[Part], name: &str) -> bool {
    let Some((first, rest)) = parts.split_first() else {
        return name.is_empty();
    };
    match first {
        Part::Text(t) => name
            .strip_prefix(t.as_str())
            .is_some_and(|n| matches(rest, n)),
        Part::Ranges(rs) => {
            let digits = name.bytes().take_while(u8::is_ascii_digit).count();
            (1..=digits.min(18)).any(|len| {
                let (num, tail) = name.split_at(len);
                let Ok(v) = num.parse::<u64>() else {
                    return false;
                };
                rs.iter().any(|&(l, h, w)| {
                    (l..=h).contains(&v) && format!("{v:0w$}") == num && matches(rest, tail)
                })
            })
        }
    }
}

fn expand_into(parts: &[Part], prefix: String, out: &mut Vec<String>) {
    let Some((first, rest)) = parts.split_first() else {
        out.push(prefix);
        return;
    };
    match first {
        Part::Text(t) => expand_into(rest, prefix + t, out),
        Part::Ranges(rs) => {
            for &(l, h, w) in rs {
                for v in l..=h {
                    expand_into(rest, format!("{prefix}{v:0w$}"), out);
                }
            }
        }
    }
}

impl Hostlist {
    /// Parses `text`; the error says what is wrong, for the caller to put after the key.
    pub fn parse(text: &str) -> Result<Hostlist, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("is empty: name nodes like \"gpu[01-04]\"".into());
        }
        let mut patterns = Vec::new();
        let mut total = 0u64;
        for item in top_level_items(t).map_err(|e| format!("'{t}' does not parse: {e}"))? {
            let p = pattern(item.trim()).map_err(|e| format!("'{t}' does not parse: {e}"))?;
            total = total.saturating_add(count(&p));
            patterns.push(p);
        }
        if total > MAX_HOSTS {
            return Err(format!(
                "'{t}' names {total} nodes (at most {MAX_HOSTS} in one hostlist)"
            ));
        }
        Ok(Hostlist {
            text: t.to_string(),
            patterns,
        })
    }

    /// Whether `node` is one of the names this list stands for (without expanding it).
    pub fn contains(&self, node: &str) -> bool {
        self.patterns.iter().any(|p| matches(p, node))
    }

    /// How many names it stands for (a name written twice counts twice).
    pub fn len(&self) -> u64 {
        self.patterns.iter().map(|p| count(p)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every name, in the order written, each once.
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.patterns {
            expand_into(p, String::new(), &mut out);
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|n| seen.insert(n.clone()));
        out
    }
}

/// `names` in hostlist syntax, as slurmctld and `scontrol show hostlist` write them:
/// `gpu[01-03,05],login1`. Names are grouped by the text before their trailing number and its
/// zero padding; each group's numbers become ranges.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    let mut groups: BTreeMap<(String, usize), Vec<u64>> = BTreeMap::new();
    let mut plain: Vec<String> = Vec::new();
    for n in names {
        let n = n.as_ref();
        let digits = n
            .bytes()
            .rev()
            .take_while(u8::is_ascii_digit)
            .count()
            .min(18);
        let (stem, num) = n.split_at(n.len() - digits);
        if num.is_empty() {
            plain.push(n.to_string());
            continue;
        }
        let width = if num.len() > 1 && num.starts_with('0') {
            num.len()
        } else {
            1
        };
        // An unpadded number keeps its own width only when it has one digit more than its
        // neighbours: `n9,n10` are one group of width 1.
        let v: u64 = num.parse().unwrap_or(0);
        groups.entry((stem.to_string(), width)).or_default().push(v);
    }
    plain.sort();
    plain.dedup();
    let mut out: Vec<String> = plain;
    for ((stem, w), mut vs) in groups {
        vs.sort_unstable();
        vs.dedup();
        if vs.len() == 1 {
            out.push(format!("{stem}{:0w$}", vs[0]));
            continue;
        }
        let mut runs: Vec<String> = Vec::new();
        let mut i = 0;
        while i < vs.len() {
            let mut j = i;
            while j + 1 < vs.len() && vs[j + 1] == vs[j] + 1 {
                j += 1;
            }
            runs.push(if i == j {
                format!("{:0w$}", vs[i])
            } else {
                format!("{:0w$}-{:0w$}", vs[i], vs[j])
            });
            i = j + 1;
        }
        out.push(format!("{stem}[{}]", runs.join(",")));
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_slurm_hostlists() {
        let h = Hostlist::parse("gpu[01-04,07],login1, n[8-10]").unwrap();
        assert_eq!(h.len(), 9);
        assert_eq!(
            h.names(),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1", "n8", "n9", "n10"]
        );
        for yes in ["gpu01", "gpu04", "gpu07", "login1", "n8", "n10"] {
            assert!(h.contains(yes), "{yes}");
        }
        for no in [
            "gpu1", "gpu05", "gpu001", "login", "login10", "n08", "n11", "gpu01x",
        ] {
            assert!(!h.contains(no), "{no}");
        }
        let two = Hostlist::parse("rack[1-2]n[01-02]").unwrap();
        assert_eq!(
            two.names(),
            ["rack1n01", "rack1n02", "rack2n01", "rack2n02"]
        );
        assert!(two.contains("rack2n02") && !two.contains("rack3n01"));
    }

    #[test]
    fn bad_hostlists_say_what_is_wrong() {
        for (bad, why) in [
            ("gpu[01-04", "without its ']'"),
            ("gpu01-04]", "without its '['"),
            ("gpu[04-01]", "runs backwards"),
            ("gpu[a-b]", "'a' is not a number"),
            ("gpu[1-2]],x", "without its '['"),
            ("a,,b", "empty name"),
            ("gpu 01", "' ' cannot be part"),
            ("", "is empty"),
            ("n[1-100000]", "at most 65536"),
        ] {
            let e = Hostlist::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn compresses_as_slurm_writes_them() {
        assert_eq!(
            compress(&["gpu03", "gpu01", "gpu02", "gpu05", "login1", "n9", "n10", "head"]),
            "head,gpu[01-03,05],login1,n[9-10]"
        );
        assert_eq!(compress(&["gpu01"]), "gpu01");
        let h = Hostlist::parse(&compress(&["a1", "a2", "b007", "b008"])).unwrap();
        assert_eq!(
            h.names(),
            ["a[1-2]", "b[007-008]"]
                .iter()
                .flat_map(|t| Hostlist::parse(t).unwrap().names())
                .collect::<Vec<_>>()
        );
    }
}
