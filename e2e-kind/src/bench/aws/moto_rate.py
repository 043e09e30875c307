"""How many mutating EC2 calls a second moto answers on this machine, without the reconciler.

A measure for the bench-aws README section, not a test. Usage (moto's venv holds boto3):

    "$(e2e-kind/moto/venv.sh)/bin/python" e2e-kind/src/bench/aws/moto_rate.py [SECONDS]

Starts its own moto_server, runs 100 m5.4xlarge instances, then for each (clients in parallel,
IPs per call) keeps AssignPrivateIpAddresses/UnassignPrivateIpAddresses pairs going on distinct
interfaces for SECONDS (default 5) and prints calls per second and IPs per second.
"""

import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time

import boto3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    port = free_port()
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        ec2 = boto3.client(
            "ec2",
            region_name="us-east-1",
            endpoint_url=url,
            aws_access_key_id="AKIDMOTORATE",
            aws_secret_access_key="moto-rate",
        )
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20")["Subnet"]["SubnetId"]
        images = ec2.describe_images()["Images"]
        instances = ec2.run_instances(
            ImageId=images[0]["ImageId"],
            InstanceType="m5.4xlarge",
            MinCount=100,
            MaxCount=100,
            SubnetId=subnet,
        )["Instances"]
        enis = [i["NetworkInterfaces"][0]["NetworkInterfaceId"] for i in instances]
        base = int(ipaddress.ip_address("10.0.4.0"))
        print(f"moto at {url}; {len(enis)} interfaces; {seconds:.0f} s per row")
        print("clients  IPs/call  calls/s  IPs/s")
        for clients, per_call in [(1, 1), (8, 1), (64, 1), (8, 10), (64, 10)]:
            counts = [0] * clients
            # Made before the clock starts: a boto3 client takes a while to build.
            made = [
                boto3.client(
                    "ec2",
                    region_name="us-east-1",
                    endpoint_url=url,
                    aws_access_key_id="AKIDMOTORATE",
                    aws_secret_access_key="moto-rate",
                )
                for _ in range(clients)
            ]
            stop = time.monotonic() + seconds

            def work(k):
                client = made[k]
                eni = enis[k % len(enis)]
                ips = [str(ipaddress.ip_address(base + k * 16 + j)) for j in range(per_call)]
                while time.monotonic() < stop:
                    client.assign_private_ip_addresses(NetworkInterfaceId=eni, PrivateIpAddresses=ips)
                    client.unassign_private_ip_addresses(NetworkInterfaceId=eni, PrivateIpAddresses=ips)
                    counts[k] += 2

            threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - started
            calls = sum(counts)
            print(f"{clients:7}  {per_call:8}  {calls / elapsed:7.1f}  {calls * per_call / elapsed:5.0f}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
