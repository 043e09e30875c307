//! docs/flags.md, the flag reference of the reconciler and the webhook, is generated from their
//! clap definitions: a flag added, removed or reworded without the page fails here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::CommandFactory;
use clap_markdown::{MarkdownOptions, help_markdown_custom};
use cloudnet_e2e::crate_file;

const REGENERATE: &str =
    "CLOUDNET_UPDATE_DOCS=1 cargo test --locked --workspace --test reconciler flags_reference";

fn render() -> String {
    let options = |title: &str| {
        MarkdownOptions::new()
            .title(title.to_owned())
            .show_footer(false)
            .show_table_of_contents(false)
    };
    format!(
        "<!-- Generated from the clap definitions (reconciler/src/process/flags.rs, webhook/src/cli.rs) by \
         e2e-kind/tests/reconciler/flags_reference.rs; do not edit. Regenerate: {REGENERATE} -->\n\n\
         # Flag reference\n\n\
         Every flag of the two servers, as `--help` prints it. The reconciler also takes each flag \
         with one dash, as upstream's Go flags are written; the webhook also reads each flag from \
         the environment, `--listen-address` from `CLOUDNET_LISTEN_ADDRESS` and so on.\n\n{}\n{}",
        help_markdown_custom::<cloudnet_reconciler::process::Flags>(&options(
            "cloudnet-reconciler"
        ))
        .replacen("# cloudnet-reconciler", "## cloudnet-reconciler", 1),
        help_markdown_custom::<cloudnet_webhook::cli::Args>(&options("cloudnet-webhook")).replacen(
            "# cloudnet-webhook",
            "## cloudnet-webhook",
            1
        ),
    )
}

#[test]
fn the_flag_reference_is_what_the_flags_say() {
    let generated = render();
    let path = crate_file("../docs/flags.md");
    if std::env::var_os("CLOUDNET_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).expect("write docs/flags.md");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "{} has drifted from the flags; regenerate it with `{REGENERATE}` and review the diff",
        path.display()
    );
}

#[test]
fn each_webhook_flag_has_the_environment_variable_the_reference_names() {
    for arg in cloudnet_webhook::cli::Args::command().get_arguments() {
        let id = arg.get_id().as_str();
        if ["help", "version"].contains(&id) {
            continue;
        }
        let expected = format!("CLOUDNET_{}", id.to_uppercase());
        assert_eq!(
            arg.get_env().and_then(|env| env.to_str()),
            Some(expected.as_str()),
            "--{id}"
        );
    }
}
