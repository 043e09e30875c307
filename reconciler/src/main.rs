//! cloudnet-reconciler: attaches and detaches egress IPs through the cloud API.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("cloudnet-reconciler is not implemented yet")
}
