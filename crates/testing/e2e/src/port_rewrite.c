/* What a user needs to aim Slurm's daemons at a port of their choice (the e2e tests of
 * slurm_daemons.rs, pure_cgroup_v2.rs and multi_node.rs): srun, sattach and salloc learn the
 * ports they listen on from getsockname() and tell slurmd; slurmd builds the addresses
 * slurmstepd connects to (I/O, launch responses, attach) from the client's address and those
 * ports. With TENANCY_REWRITE_PORT set, every IPv4 port getsockname() reports is that one.
 * Built by the tests with gcc, loaded with LD_PRELOAD into the user's own client. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	static int (*real)(int, struct sockaddr *, socklen_t *);
	const char *port = getenv("TENANCY_REWRITE_PORT");
	int rc;

	if (!real)
		real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "getsockname");
	rc = real(fd, addr, len);
	if (rc == 0 && port && addr->sa_family == AF_INET)
		((struct sockaddr_in *)addr)->sin_port = htons((unsigned short)atoi(port));
	return rc;
}
