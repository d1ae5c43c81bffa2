#!/bin/sh
# Prints the variable the submitter set, as the job sees it.
echo "var=$TENANCY_E2E_VAR"
