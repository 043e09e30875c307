"""Starts real Keystone and Neutron on free 127.0.0.1 ports for the OpenStack tests.

Usage: servers.py RUN_DIR [--token-expiration SECONDS] [--max-pairs N] [--no-token-cache]
                  [--pagination-max-limit N] [--ready-timeout SECONDS] [--floating-ips]

Keystone (sqlite, fernet tokens) and Neutron (ml2 without mechanism drivers, sqlite, no agents,
a fake message transport) run under gunicorn with one worker and one thread each: sqlite answers
"database is locked" to concurrent writers. When both answer, RUN_DIR/ready.json holds their URLs
and the credentials of a `cloudnet` member user of project `cloudnet`, of a `cloudnet-reader`
reader of that project, and of the admin. With --floating-ips Neutron also runs its L3 router
service plugin (routers, external networks, floating IPs). The script
then waits; SIGTERM or SIGINT stops both servers.

Nothing here may depend on how fast the machine is: a new CI machine starts these servers while it
compiles, and then one step can take a minute where it takes a second on a quiet machine. So the
set-up re-authenticates whenever Keystone's (possibly seconds-long) token lifetime runs out, every
wait shares one deadline that the caller passes (--ready-timeout), and a member's first Neutron
call (Keystone middleware's own token, the policy engine, lazily imported extensions) is made here,
before ready.json, so that no test's first call pays for it.
"""
import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.dirname(sys.executable)
ADMIN_PASSWORD = "cloudnet-admin"
SERVICE_PASSWORD = "cloudnet-neutron"
USER_PASSWORD = "cloudnet-member"
READER_PASSWORD = "cloudnet-reader"
# How long one HTTP call of the set-up may take (it is a set-up step, not a measurement).
CALL_TIMEOUT = 300
# gunicorn restarts a worker that has not reported for this long. A restart loses the requests
# under way and re-imports Neutron (half a minute under load), so it must never hit a worker
# that is merely slow: a bulk create of hundreds of ports on a loaded machine takes minutes.
WORKER_TIMEOUT = 900


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method, url, body=None, token=None, ok=(200, 201, 204)):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("X-Auth-Token", token)
    try:
        with urllib.request.urlopen(req, timeout=CALL_TIMEOUT) as resp:
            text = resp.read()
            return resp.status, resp.headers, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        if e.code in ok:
            return e.code, e.headers, None
        raise Refused(method, url, e.code, e.read()[:300]) from None


class Refused(RuntimeError):
    """An HTTP answer outside the accepted codes."""

    def __init__(self, method, url, code, body):
        super().__init__(f"{method} {url}: HTTP {code}: {body!r}")
        self.code = code


class Session:
    """A user's token, taken again when Keystone refuses it: with a short `[token] expiration`
    (some tests use 10 s) the set-up under load outlives the token it started with."""

    def __init__(self, url, user, password, project):
        self.url, self.user, self.password, self.project = url, user, password, project
        self.token = None

    def login(self):
        self.token = token(self.url, self.user, self.password, self.project)

    def call(self, method, url, body=None, ok=(200, 201, 204)):
        if self.token is None:
            self.login()
        try:
            return call(method, url, body, self.token, ok)
        except Refused as e:
            if e.code != 401:
                raise
        self.login()
        return call(method, url, body, self.token, ok)


def wait_http(url, proc, name, deadline):
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer before the set-up's deadline")
        time.sleep(0.1)


def run(cmd, env, log):
    subprocess.run(cmd, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)


PR_SET_PDEATHSIG = 1


def die_with_us():
    """Runs in the forked child: the kernel kills it when this script dies.

    The harness kills this script with SIGKILL when the test process exits without stopping it
    (a static never dropped), and then no handler of ours runs; without this the servers would
    outlive every test run (about 330 MB a pair).
    """
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def gunicorn(app, port, env, log, chdir):
    return subprocess.Popen(
        [os.path.join(VENV_BIN, "gunicorn"), "--config", os.path.join(HERE, "gunicorn_conf.py"),
         "--bind", f"127.0.0.1:{port}", "--workers", "1",
         "--threads", "1", "--timeout", str(WORKER_TIMEOUT), "--chdir", chdir, app],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=die_with_us)


def keystone(run_dir, port, expiration, log, procs, deadline):
    url = f"http://127.0.0.1:{port}"
    conf = os.path.join(run_dir, "keystone.conf")
    with open(conf, "w") as f:
        f.write(f"""[DEFAULT]
use_stderr = true
[database]
connection = sqlite:///{run_dir}/keystone.db
[token]
provider = fernet
expiration = {expiration}
[fernet_tokens]
key_repository = {run_dir}/fernet-keys
[fernet_receipts]
key_repository = {run_dir}/fernet-keys
[credential]
key_repository = {run_dir}/credential-keys
""")
    env = dict(os.environ, OS_KEYSTONE_CONFIG_DIR=run_dir, OS_KEYSTONE_CONFIG_FILES="keystone.conf")
    manage = [os.path.join(VENV_BIN, "keystone-manage"), "--config-file", conf]
    user = os.getuid()
    group = os.getgid()
    run(manage + ["db_sync"], env, log)
    for step in ("fernet_setup", "credential_setup"):
        run(manage + [step, "--keystone-user", str(user), "--keystone-group", str(group)], env, log)
    run(manage + ["bootstrap", "--bootstrap-password", ADMIN_PASSWORD,
                  "--bootstrap-region-id", "RegionOne",
                  "--bootstrap-admin-url", f"{url}/v3",
                  "--bootstrap-internal-url", f"{url}/v3",
                  "--bootstrap-public-url", f"{url}/v3"], env, log)
    proc = gunicorn("keystone_app:application", port, env, log, HERE)
    procs.append(proc)
    wait_http(f"{url}/v3", proc, "keystone", deadline)
    return url


def token(url, user, password, project):
    _, headers, _ = call("POST", f"{url}/v3/auth/tokens", {"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": user, "domain": {"id": "default"}, "password": password}}},
        "scope": {"project": {"name": project, "domain": {"id": "default"}}}}})
    return headers["X-Subject-Token"]


def populate(url, neutron_url):
    admin = Session(url, "admin", ADMIN_PASSWORD, "admin")
    v3 = f"{url}/v3"
    _, _, body = admin.call("POST", f"{v3}/services", {"service": {"type": "network", "name": "neutron"}})
    service = body["service"]["id"]
    for interface in ("public", "internal", "admin"):
        admin.call("POST", f"{v3}/endpoints", {"endpoint": {
            "service_id": service, "interface": interface, "region_id": "RegionOne",
            "url": neutron_url}})
    roles = {r["name"]: r["id"] for r in admin.call("GET", f"{v3}/roles")[2]["roles"]}
    ids = {}
    for project, user, password, role_names in (
            ("service", "neutron", SERVICE_PASSWORD, ("admin", "service")),
            ("cloudnet", "cloudnet", USER_PASSWORD, ("member",))):
        _, _, body = admin.call("POST", f"{v3}/projects", {"project": {"name": project, "domain_id": "default"}})
        project_id = body["project"]["id"]
        _, _, body = admin.call("POST", f"{v3}/users", {"user": {
            "name": user, "password": password, "domain_id": "default",
            "default_project_id": project_id}})
        user_id = body["user"]["id"]
        for name in role_names:
            admin.call("PUT", f"{v3}/projects/{project_id}/users/{user_id}/roles/{roles[name]}")
        ids[project] = (project_id, user_id)
    # A `reader` of the same project: Neutron's default policy lets it read everything the member
    # reads and refuses every write, as a deployment refuses a write its credentials lack.
    _, _, body = admin.call("POST", f"{v3}/users", {"user": {
        "name": "cloudnet-reader", "password": READER_PASSWORD, "domain_id": "default",
        "default_project_id": ids["cloudnet"][0]}})
    admin.call("PUT", f"{v3}/projects/{ids['cloudnet'][0]}/users/{body['user']['id']}/roles/{roles['reader']}")
    return ids


def neutron(run_dir, port, keystone_url, max_pairs, token_cache, page_limit, floating_ips, log,
            procs, deadline):
    url = f"http://127.0.0.1:{port}"
    venv = os.path.dirname(VENV_BIN)
    conf = os.path.join(run_dir, "neutron.conf")
    ml2 = os.path.join(run_dir, "ml2_conf.ini")
    with open(conf, "w") as f:
        f.write(f"""[DEFAULT]
core_plugin = ml2
service_plugins = {'router' if floating_ips else ''}
auth_strategy = keystone
transport_url = fake:/
api_paste_config = {venv}/etc/neutron/api-paste.ini
bind_host = 127.0.0.1
bind_port = {port}
rpc_workers = 0
rpc_state_report_workers = 0
max_allowed_address_pairs = {max_pairs}
pagination_max_limit = {page_limit or -1}
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
use_stderr = true
state_path = {run_dir}
[database]
connection = sqlite:///{run_dir}/neutron.db
[keystone_authtoken]
www_authenticate_uri = {keystone_url}
auth_url = {keystone_url}
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = neutron
password = {SERVICE_PASSWORD}
{'' if token_cache else 'token_cache_time = -1'}
[oslo_concurrency]
lock_path = {run_dir}/lock
[agent]
report_interval = 0
""")
    with open(ml2, "w") as f:
        f.write("""[ml2]
type_drivers = flat,vxlan
tenant_network_types = vxlan
mechanism_drivers =
extension_drivers = port_security
[ml2_type_vxlan]
vni_ranges = 1:1000
""")
    # Alembic cannot alter sqlite's constraints: create the schema from the models, as Neutron's
    # own tests do.
    schema = ("import sqlalchemy\n"
              "from neutron.db.migration.models import head\n"
              "from neutron_lib.db import model_base\n"
              f"model_base.BASEV2.metadata.create_all(sqlalchemy.create_engine('sqlite:///{run_dir}/neutron.db'))\n")
    run([sys.executable, "-c", schema], os.environ, log)
    env = dict(os.environ, CLOUDNET_NEUTRON_CONFIG=f"{conf};{ml2}")
    proc = gunicorn("neutron_app:application", port, env, log, HERE)
    procs.append(proc)
    wait_http(f"{url}/", proc, "neutron", deadline)
    return url


def warm(keystone_url, neutron_url, floating_ips):
    """A member's first Neutron calls: Keystone middleware takes its own service token and
    validates the member's, the policy engine loads, and list and show paths import what they
    import lazily. On a loaded machine that first call took most of a minute."""
    member = Session(keystone_url, "cloudnet", USER_PASSWORD, "cloudnet")
    for path in ("networks", "subnets", "ports") + (("routers", "floatingips") if floating_ips else ()):
        member.call("GET", f"{neutron_url}/v2.0/{path}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--token-expiration", type=int, default=3600)
    parser.add_argument("--max-pairs", type=int, default=10)
    # Neutron validates every token with Keystone instead of caching the answer for 5 minutes,
    # so a revoked token is refused at once.
    parser.add_argument("--no-token-cache", action="store_true")
    # Neutron cuts every list into pages of at most this many items, as deployments that cap
    # their lists do.
    parser.add_argument("--pagination-max-limit", type=int, default=None)
    # The whole set-up's deadline; the caller's own wait for ready.json is the same.
    parser.add_argument("--ready-timeout", type=int, default=600)
    # Neutron's L3 router service plugin: routers, external networks and floating IPs (the
    # `router`, `external-net` and `fip-port-details` extensions). Without agents a router is
    # only rows in the database, which is all a floating IP's association needs.
    parser.add_argument("--floating-ips", action="store_true")
    args = parser.parse_args()
    run_dir = os.path.abspath(args.run_dir)
    os.makedirs(os.path.join(run_dir, "lock"), exist_ok=True)
    procs = []

    def stop(*_):
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    started = time.monotonic()
    deadline = started + args.ready_timeout
    try:
        with open(os.path.join(run_dir, "keystone.log"), "ab") as klog, \
                open(os.path.join(run_dir, "neutron.log"), "ab") as nlog:
            kport, nport = free_port(), free_port()
            keystone_url = keystone(run_dir, kport, args.token_expiration, klog, procs, deadline)
            neutron_url = f"http://127.0.0.1:{nport}"
            ids = populate(keystone_url, neutron_url)
            neutron(run_dir, nport, keystone_url, args.max_pairs, not args.no_token_cache,
                    args.pagination_max_limit, args.floating_ips, nlog, procs, deadline)
            warm(keystone_url, neutron_url, args.floating_ips)
            ready = {
                "keystone_url": keystone_url,
                "neutron_url": neutron_url,
                "region": "RegionOne",
                "admin": {"username": "admin", "password": ADMIN_PASSWORD, "project": "admin"},
                "member": {"username": "cloudnet", "password": USER_PASSWORD, "project": "cloudnet",
                           "project_id": ids["cloudnet"][0], "user_id": ids["cloudnet"][1]},
                "reader": {"username": "cloudnet-reader", "password": READER_PASSWORD,
                           "project": "cloudnet"},
                "startup_seconds": round(time.monotonic() - started, 1),
                "pids": [p.pid for p in procs],
            }
            tmp = os.path.join(run_dir, "ready.json.tmp")
            with open(tmp, "w") as f:
                json.dump(ready, f)
            os.rename(tmp, os.path.join(run_dir, "ready.json"))
            # Stop with our parent: a killed test must not leave servers behind.
            parent = os.getppid()
            while True:
                for proc in procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"server {proc.args[-1]} exited with {proc.returncode}")
                if os.getppid() != parent:
                    stop()
                time.sleep(0.5)
    except Exception as e:  # noqa: BLE001
        print(f"servers.py: {e}", file=sys.stderr)
        stop()
        sys.exit(1)


if __name__ == "__main__":
    main()
