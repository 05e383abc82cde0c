# A test host for tests/deploy/test_ansible_rollout.py: Debian bookworm with systemd as
# PID 1 and sshd, nothing of HyCache (the playbook installs everything). Run with
#   --cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined
#   --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        systemd systemd-sysv dbus openssh-server python3 sudo iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && systemctl enable ssh \
 && systemctl mask systemd-logind.service getty.target console-getty.service \
 && mkdir -p /root/.ssh && chmod 700 /root/.ssh \
 && sed -i 's/^#\?PermitRootLogin.*/PermitRootLogin prohibit-password/' /etc/ssh/sshd_config
STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
