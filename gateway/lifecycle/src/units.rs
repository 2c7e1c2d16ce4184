//! Amounts as users wrote them: the API's units (cores, MiB, GPUs), not the
//! engine's (millicores, milli-GPUs). Every message a user reads — refusals
//! and pending reasons — goes through here.

use peloton_engine::Dim;

/// `amount` (engine units of `dim`) in the API's units: "2.5 cores",
/// "512 MiB", "1 GPU".
pub fn amount(dim: Dim, amount: u64) -> String {
    if amount >= peloton_engine::MAX_AMOUNT {
        return "unlimited".into();
    }
    let thousandths = |v: u64| {
        let (whole, frac) = (v / 1000, v % 1000);
        if frac == 0 {
            whole.to_string()
        } else {
            format!("{whole}.{frac:03}")
                .trim_end_matches('0')
                .to_string()
        }
    };
    let plural = |v: u64, one: &str, many: &str| {
        if v == 1000 {
            format!("1 {one}")
        } else {
            format!("{} {many}", thousandths(v))
        }
    };
    match dim {
        Dim::Cpu => plural(amount, "core", "cores"),
        Dim::Memory | Dim::Disk => format!("{amount} MiB"),
        Dim::Gpu => plural(amount, "GPU", "GPUs"),
    }
}

/// The API's field of a dimension in `Resources` (`cpu`, `memory_mb`, …).
pub fn field(dim: Dim) -> &'static str {
    match dim {
        Dim::Cpu => "cpu",
        Dim::Memory => "memory_mb",
        Dim::Disk => "disk_mb",
        Dim::Gpu => "gpu",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_as_the_api_writes_them() {
        let shown: Vec<String> = [
            (Dim::Cpu, 500),
            (Dim::Cpu, 1000),
            (Dim::Cpu, 2500),
            (Dim::Cpu, 4000),
            (Dim::Cpu, 1),
            (Dim::Memory, 256),
            (Dim::Disk, 1024),
            (Dim::Gpu, 1000),
            (Dim::Gpu, 250),
            (Dim::Cpu, peloton_engine::MAX_AMOUNT),
        ]
        .into_iter()
        .map(|(d, v)| amount(d, v))
        .collect();
        assert_eq!(
            shown,
            [
                "0.5 cores",
                "1 core",
                "2.5 cores",
                "4 cores",
                "0.001 cores",
                "256 MiB",
                "1024 MiB",
                "1 GPU",
                "0.25 GPUs",
                "unlimited"
            ]
        );
    }
}
