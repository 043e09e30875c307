#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What an operator reads when a binary cannot start: one log line naming every cause (no
//! multi-line report, no empty "Caused by"), exit code 1, and, since the output is a pipe here as
//! in a pod, no terminal colour codes. Runs the built binaries; no control plane is needed.

use std::process::{Command, Output};

use cloudnet_e2e::harness::binaries;

fn run(mut command: Command) -> (i32, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().unwrap();
    let mut text = stdout;
    text.extend(stderr);
    assert!(
        !text.contains(&0x1b),
        "an escape code in piped output:\n{}",
        String::from_utf8_lossy(&text)
    );
    (
        status.code().unwrap_or(-1),
        String::from_utf8(text).unwrap(),
    )
}

/// The reconciler with upstream's flags and a kubeconfig at `kubeconfig`.
fn reconciler(kubeconfig: &str) -> Command {
    let mut command = Command::new(binaries::reconciler().unwrap());
    command
        .args([
            "-secret-name=cloud-credentials",
            "-platform-type=AWS",
            "-platform-region=us-east-1",
            &format!("-kubeconfig={kubeconfig}"),
            "--metrics-bind-address=127.0.0.1:0",
        ])
        .env("RUST_LOG", "info");
    without_proxies(&mut command);
    command
}

/// `command` with none of the machine's proxy variables.
fn without_proxies(command: &mut Command) {
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        command.env_remove(name);
    }
}

/// The one error line of `output`, asserting it is the only one and names each of `causes`.
fn the_error_line<'a>(output: &'a str, causes: &[&str]) -> &'a str {
    let errors: Vec<&str> = output.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line expected:\n{output}");
    let line = errors[0];
    for cause in causes {
        assert!(line.contains(cause), "{cause:?} missing from {line:?}");
    }
    assert!(!output.contains("Caused by"), "{output}");
    line
}

#[test]
fn a_missing_kubeconfig_is_one_line_naming_the_file_and_the_os_error() {
    let (code, output) = run(reconciler("/nonexistent/kubeconfig"));
    assert_eq!(code, 1, "{output}");
    the_error_line(
        &output,
        &["kubeconfig", "/nonexistent/kubeconfig", "No such file"],
    );
}

#[test]
fn an_unusable_proxy_is_one_line_naming_the_variable_and_why() {
    let mut command = reconciler("/nonexistent/kubeconfig");
    command.env("HTTPS_PROXY", "socks5://proxy.example:1080");
    let (code, output) = run(command);
    assert_eq!(code, 1, "{output}");
    the_error_line(
        &output,
        &["socks5://proxy.example:1080", "HTTPS_PROXY", "only http://"],
    );
}

#[test]
fn impossible_leader_timings_are_one_line_naming_the_rule() {
    let mut command = reconciler("/nonexistent/kubeconfig");
    command.args([
        "--leader-elect-lease-duration=10",
        "--leader-elect-renew-deadline=10",
    ]);
    let (code, output) = run(command);
    assert_eq!(code, 1, "{output}");
    the_error_line(&output, &["leader election", "renew deadline"]);
}

#[test]
fn the_webhook_reports_a_missing_kubeconfig_in_one_line_without_colour() {
    let mut command = Command::new(binaries::webhook().unwrap());
    command
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .env("RUST_LOG", "info");
    let (code, output) = run(command);
    assert_eq!(code, 1, "{output}");
    the_error_line(&output, &["/nonexistent/kubeconfig", "No such file"]);
}

/// The arguments and environment OpenShift's network operator renders for the controller
/// (cluster-network-operator bindata/cloud-network-config-controller/self-hosted/
/// controller.yaml), every template value empty but the platform type and the release.
fn as_the_network_operator_runs_it() -> Command {
    let mut command = Command::new(binaries::reconciler().unwrap());
    command
        .args([
            "-platform-type",
            "AWS",
            "-platform-region=",
            "-platform-api-url=",
            "-platform-aws-ca-override=",
            "-platform-azure-environment=",
            "-secret-name",
            "cloud-credentials",
        ])
        .env(
            "CONTROLLER_NAMESPACE",
            "openshift-cloud-network-config-controller",
        )
        .env("CONTROLLER_NAME", "cloud-network-config-controller")
        .env("RELEASE_VERSION", "4.18.0")
        // Outside a pod: no in-cluster apiserver, no kubeconfig, so the start stops there.
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "info");
    without_proxies(&mut command);
    command
}

#[test]
fn the_network_operators_command_line_is_parsed_and_the_start_goes_on() {
    let (code, output) = run(as_the_network_operator_runs_it());
    // Past the flags: the start fails only for want of a cluster, in the process's one line.
    assert_eq!(code, 1, "{output}");
    assert!(!output.contains("Usage:"), "a flag was refused:\n{output}");
    let line = the_error_line(&output, &["cannot run"]);
    assert!(
        line.contains("in-cluster") || line.contains("kubeconfig"),
        "{line}"
    );
}

#[test]
fn version_prints_cloudnets_version_and_the_openshift_release() {
    for spelling in ["--version", "-version"] {
        let mut command = as_the_network_operator_runs_it();
        command.arg(spelling);
        let (code, output) = run(command);
        assert_eq!(code, 0, "{output}");
        assert_eq!(
            output.trim(),
            format!(
                "cloudnet-reconciler {} (OpenShift release 4.18.0)",
                env!("CARGO_PKG_VERSION")
            )
        );
    }
}

#[test]
fn the_webhook_and_the_certificate_tool_print_the_workspace_version() {
    for (binary, name) in [
        (binaries::webhook().unwrap(), "cloudnet-webhook"),
        (binaries::certs().unwrap(), "cloudnet-webhook-certs"),
    ] {
        let mut command = Command::new(binary);
        command.arg("--version");
        let (code, output) = run(command);
        assert_eq!(code, 0, "{output}");
        assert_eq!(
            output.trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

/// The reconciler's flags for `platform` with the credentials mounted at `secret_dir`.
fn cloud_flags(
    platform: &str,
    secret_dir: &std::path::Path,
) -> cloudnet_reconciler::process::Flags {
    let args = [
        "cloudnet-reconciler".to_owned(),
        "-secret-name=cloud-credentials".to_owned(),
        format!("-platform-type={platform}"),
        "-platform-region=us-east-1".to_owned(),
        format!("-secret-override={}", secret_dir.display()),
        format!("-config-override={}", secret_dir.join("config").display()),
    ];
    cloudnet_reconciler::process::Flags::from_args(args).unwrap()
}

/// The one-line report of the set-up failure of the cloud `flags` name.
async fn cloud_setup_failure(flags: &cloudnet_reconciler::process::Flags) -> String {
    let error = cloudnet_reconciler::process::providers::build(flags)
        .await
        .err()
        .expect("the set-up must fail");
    let line = cloudnet_shared::report::one_line(&error);
    assert!(!line.contains("not supported"), "{line}");
    assert!(!line.contains('\n'), "{line}");
    line
}

#[tokio::test]
async fn a_missing_aws_key_file_is_reported_as_a_missing_key_file() {
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("aws_access_key_id"), "AKIDEXAMPLE").unwrap();
    let line = cloud_setup_failure(&cloud_flags("AWS", secrets.path())).await;
    assert!(line.starts_with("AWS: "), "{line}");
    assert!(
        line.contains("aws_access_key_id is present but aws_secret_access_key is not"),
        "{line}"
    );
    assert!(
        line.contains(&secrets.path().display().to_string()),
        "{line}"
    );
    // No key file at all names the directory and what was expected there.
    let empty = tempfile::tempdir().unwrap();
    let line = cloud_setup_failure(&cloud_flags("aws", empty.path())).await;
    assert!(line.contains("no AWS credentials in"), "{line}");
    assert!(line.contains("aws_secret_access_key"), "{line}");
}

#[tokio::test]
async fn a_missing_openstack_clouds_yaml_is_reported_with_its_path_and_the_os_error() {
    let secrets = tempfile::tempdir().unwrap();
    let line = cloud_setup_failure(&cloud_flags("OpenStack", secrets.path())).await;
    assert!(line.starts_with("OpenStack: "), "{line}");
    let path = secrets.path().join("clouds.yaml");
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert!(line.contains("No such file"), "{line}");
}

#[test]
fn the_platform_flag_takes_upstreams_spellings_and_the_hidden_memory_platform_only() {
    use cloudnet_reconciler::process::PlatformType;
    use cloudnet_shared::Platform;
    let dir = std::path::Path::new("/nonexistent");
    for (spelling, platform) in [
        ("AWS", PlatformType::Cloud(Platform::Aws)),
        ("Azure", PlatformType::Cloud(Platform::Azure)),
        ("GCP", PlatformType::Cloud(Platform::Gcp)),
        ("OpenStack", PlatformType::Cloud(Platform::OpenStack)),
        ("openstack", PlatformType::Cloud(Platform::OpenStack)),
        ("memory", PlatformType::Memory),
    ] {
        assert_eq!(
            cloud_flags(spelling, dir).platform_type,
            platform,
            "{spelling}"
        );
    }
    let (code, output) = run({
        let mut command = Command::new(binaries::reconciler().unwrap());
        command.args(["-secret-name=x", "-platform-type=Nimbus"]);
        command
    });
    assert_ne!(code, 0, "{output}");
    assert!(output.contains("unknown platform \"Nimbus\""), "{output}");
    assert!(
        !output.contains("memory"),
        "the hidden platform stays hidden: {output}"
    );
}
