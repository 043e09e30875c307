//! cloudnet-webhook: validating and mutating admission webhook for CloudPrivateIPConfig.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("cloudnet-webhook is not implemented yet")
}
