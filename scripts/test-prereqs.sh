#!/usr/bin/env bash
# What the test suite needs beyond the venv: OpenSSH's server and client (the SSH path is tested
# against a real sshd on loopback). `make test` and .ci/run both call this script.
# Installs them with apt-get when missing and possible (root); otherwise says in one line that
# the tests needing them will be skipped. Never fails.
need=()
if ! PATH="/usr/sbin:/usr/local/sbin:/sbin:$PATH" command -v sshd >/dev/null 2>&1; then
  need+=(openssh-server)
fi
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
[ ${#need[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${need[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test prerequisites: installing ${pkgs}"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq && apt-get install -y -qq --no-install-recommends ${pkgs} >/dev/null; then
    exit 0
  fi
  echo "test prerequisites: apt-get could not install ${pkgs}; the tests that need them are skipped"
  exit 0
fi
echo "test prerequisites: ${pkgs}missing (installing needs root and apt-get); the tests that need them are skipped"
exit 0
