//! `[billing]`: the currency and the prices statements multiply usage by.
//!
//! Prices are decimals read from the config's own text (`0.85`, `"0.85"` or `1_200`), never
//! through a binary float: `0.1 + 0.2` must be `0.3` on an invoice.

use rust_decimal::Decimal;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::str::FromStr;
use toml::Spanned;

/// At most this many decimal places in a price (a tenth of a thousandth of a cent).
pub const MAX_RATE_SCALE: u32 = 6;

/// Validated prices.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Billing {
    /// ISO 4217 code, e.g. `EUR`.
    pub currency: String,
    /// MIG profile -> price of one slice-hour of it.
    pub rates: BTreeMap<String, Decimal>,
    /// Price of one hour of a job that had no MIG slice.
    pub job_hour_without_mig: Decimal,
}

impl Billing {
    /// The price of one hour of `profile` (`None`: a job without a MIG slice).
    pub fn rate(&self, profile: Option<&str>) -> Option<Decimal> {
        match profile {
            None => Some(self.job_hour_without_mig),
            Some(p) => self.rates.get(p).copied(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBilling {
    pub currency: Spanned<String>,
    #[serde(default)]
    pub rates: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    pub job_hour_without_mig: Option<Spanned<toml::Value>>,
}

/// A price from its text in the file: a TOML integer or float literal (underscores allowed) or
/// a string holding a decimal. The literal is parsed as a decimal, so no float rounding.
pub(crate) fn parse_rate(
    value: &Spanned<toml::Value>,
    source: &str,
    key: &str,
) -> Result<Decimal, String> {
    let text = match value.get_ref() {
        toml::Value::String(s) => s.trim().to_string(),
        toml::Value::Integer(_) | toml::Value::Float(_) => source
            .get(value.span())
            .unwrap_or_default()
            .trim()
            .replace('_', ""),
        other => {
            return Err(format!(
                "{key} must be a price per hour such as 0.85 or \"0.85\", found a {}",
                other.type_str()
            ))
        }
    };
    let d = Decimal::from_str(text.trim_start_matches('+')).map_err(|_| {
        format!("{key} = {text}: not a decimal price; write it like 0.85 or \"0.85\"")
    })?;
    if d.is_sign_negative() && !d.is_zero() {
        return Err(format!(
            "{key} = {text}: a price cannot be negative (0 makes the usage free)"
        ));
    }
    if d.normalize().scale() > MAX_RATE_SCALE {
        return Err(format!(
            "{key} = {text}: at most {MAX_RATE_SCALE} decimal places in a price"
        ));
    }
    Ok(d.normalize())
}

/// ISO 4217 form: three capital letters.
pub(crate) fn valid_currency(c: &str) -> bool {
    c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase())
}
