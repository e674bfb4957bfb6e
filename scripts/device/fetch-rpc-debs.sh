#!/bin/bash
# Here (Debian 12): fetch the Debian packages the daemon's build needs (protobuf-c with protoc-c,
# libevent, libsystemd, jansson, and systemd with libsystemd-shared and the two libraries of it an
# Ubuntu image may lack, for systemd-socket-activate) into .devcarry/rpc-debs,
# for a GPU-machine call that names `.devcarry/rpc-debs` in carry; scripts/device/rpc-env.sh
# unpacks them there. The GPU machine's image (Ubuntu 24.04) has none of their headers and no
# registry access. About 8.5 MB.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .devcarry/rpc-debs
cd .devcarry/rpc-debs
rm -f ./*.deb
apt-get download libprotobuf-c-dev libprotobuf-c1 protobuf-c-compiler libprotoc32 libprotobuf32 \
        libevent-dev libevent-2.1-7 libevent-core-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7 \
        libevent-pthreads-2.1-7 libsystemd-dev libsystemd0 libjansson-dev libjansson4 systemd libsystemd-shared \
        libip4tc2 libkmod2 2>&1 | tail -1
ls -1 | wc -l
