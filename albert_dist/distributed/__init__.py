"""Who am I: rank and world discovery, the process group and its collectives, Slurm, local ranks, rendezvous."""
