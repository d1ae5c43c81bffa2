#!/bin/sh
# A job that only holds what it was given (Client::sbatch_sleep): SECONDS.
exec sleep "$1"
