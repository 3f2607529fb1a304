#!/bin/sh
# What `make test-slurm` needs, installed only where missing (Debian/Ubuntu, as root): slurmctld, slurmd,
# slurm-client (sbatch, srun, scontrol, sinfo, squeue, scancel) and munge. Never fails the make: without
# root or apt the SLURM tests skip with one line saying what is missing.
tools="munged slurmctld slurmd sbatch srun scontrol sinfo squeue scancel"
missing=""
for t in $tools; do
    command -v "$t" >/dev/null 2>&1 || missing="$missing $t"
done
if [ -z "$missing" ]; then
    echo "test-slurm: SLURM and munge are installed"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "test-slurm: missing:$missing; not root, so not installing them (the SLURM tests will skip)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test-slurm: missing:$missing; no apt-get here: install slurmctld, slurmd, the SLURM client and munge"
    exit 0
fi
echo "test-slurm: installing slurmctld slurmd slurm-client munge (missing:$missing)"
# the package lists may be absent (a fresh container): fetch them only then
apt-cache show slurmctld >/dev/null 2>&1 || apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
    >/dev/null || echo "test-slurm: apt-get install failed: see above (the SLURM tests will skip)"
exit 0
