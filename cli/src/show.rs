//! How sharing amounts and costs read for people, in every command's
//! output: `cpu 2, memory 1Gi, pods 10`.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use liqo_api::sharing::{Cost, Resources};

/// Resources as people read them: `cpu 2, memory 1Gi, pods 10`, and
/// `, storage 20Gi in 10 claims` where storage is granted.
pub(crate) fn show_resources(r: &Resources) -> String {
    let q = |q: &Option<Quantity>| q.as_ref().map_or("0".to_owned(), |q| q.0.clone());
    let bytes = |q: &Option<Quantity>| q.as_ref().map_or("0".to_owned(), |q| show_bytes(&q.0));
    let mut out = format!(
        "cpu {}, memory {}, pods {}",
        q(&r.cpu),
        bytes(&r.memory),
        q(&r.pods)
    );
    if r.storage.is_some() || r.claims.is_some() {
        out.push_str(&format!(
            ", storage {} in {} claims",
            bytes(&r.storage),
            q(&r.claims)
        ));
    }
    out
}

/// A size as people read it: a quantity with a unit as it is (`1Gi`,
/// `500M`); a bare number of bytes, as a grant that follows free capacity
/// holds, in the largest binary unit it reaches, exact (`12Gi`) or to a
/// tenth below (`11.7Gi`).
fn show_bytes(quantity: &str) -> String {
    let Ok(n) = quantity.parse::<u64>() else {
        return quantity.to_owned();
    };
    let Some((unit, size)) = [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ]
    .into_iter()
    .find(|(_, size)| n >= *size) else {
        return quantity.to_owned();
    };
    if n % size == 0 {
        format!("{}{unit}", n / size)
    } else {
        let tenths = u128::from(n) * 10 / u128::from(size);
        format!("{}.{}{unit}", tenths / 10, tenths % 10)
    }
}

/// A cost as people read it: `0.02 EUR per CPU-hour, 0.005 EUR per GiB-hour`.
pub(crate) fn show_cost(c: &Cost) -> String {
    let price = |p: &str| {
        if c.currency.is_empty() {
            p.to_owned()
        } else {
            format!("{p} {}", c.currency)
        }
    };
    let mut parts = Vec::new();
    if let Some(p) = &c.cpu_hour {
        parts.push(format!("{} per CPU-hour", price(p)));
    }
    if let Some(p) = &c.memory_gib_hour {
        parts.push(format!("{} per GiB-hour", price(p)));
    }
    if parts.is_empty() {
        return "-".to_owned();
    }
    parts.join(", ")
}

/// `items` joined with commas, or "none": how an error lists what
/// there is instead of what was asked for.
pub fn list_or_none(items: &[impl AsRef<str>]) -> String {
    if items.is_empty() {
        return "none".to_owned();
    }
    items
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_and_quantities_with_units_stay() {
        assert_eq!(show_bytes("12584777728"), "11.7Gi");
        assert_eq!(show_bytes("12884901888"), "12Gi");
        assert_eq!(show_bytes("1048576"), "1Mi");
        assert_eq!(show_bytes("1000"), "1000");
        assert_eq!(show_bytes("1Gi"), "1Gi");
        assert_eq!(show_bytes("500M"), "500M");
        assert_eq!(show_bytes("0"), "0");
    }
}
