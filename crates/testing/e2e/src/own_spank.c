/* A SPANK plugin of a user's own, in place of the product's (Cluster::own_plugstack): it hands
 * the job whatever tenant and MIG profile OWN_TENANT / OWN_MIG say, unchecked, as the product's
 * plugin hands on its checked choice. What a user who leaves the submit-side check out can do. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <slurm/spank.h>

SPANK_PLUGIN(own, 1);

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	const char *tenant = getenv("OWN_TENANT"), *mig = getenv("OWN_MIG");

	if (spank_context() != S_CTX_LOCAL && spank_context() != S_CTX_ALLOCATOR)
		return 0;
	if (tenant)
		spank_job_control_setenv(sp, "TENANCY_TENANT", tenant, 1);
	if (mig)
		spank_job_control_setenv(sp, "TENANCY_MIG", mig, 1);
	return 0;
}
