#!/bin/sh
# A job that does nothing (what a test submits to see it run or refused).
true
