package validation

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// validateNoOrphanedVoter refuses an update that drops from
// spec.externalMembers a member that the Etcd's status shows as a voter,
// while the Etcd keeps members of its own (replicas > 0): the dropped
// member would stay a voter that no controller manages (nobody lists it,
// and a member is never removed for its name alone), a vote the cluster
// depends on with nobody to replace or remove it. An Etcd scaled to zero
// gives the cluster up and may forget whom it listed (the last step of a
// live move).
func validateNoOrphanedVoter(newE, oldE *v1alpha1.Etcd) field.ErrorList {
	if newE.Spec.Replicas == 0 || oldE.Status.Membership == nil {
		return nil
	}
	var errs field.ErrorList
	path := field.NewPath("spec", "externalMembers")
	for _, x := range oldE.Spec.ExternalMembers {
		if _, kept := newE.Spec.ExternalMember(x.Name); kept {
			continue
		}
		for _, m := range oldE.Status.Membership.Members {
			if m.Name == x.Name && m.Votes() {
				errs = append(errs, field.Forbidden(path, fmt.Sprintf(
					"dropping %s, a voter of the etcd cluster (status.membership.members), would leave it managed by no one; "+
						"retire it first (externalMembersPolicy: Retire removes it), or drop it once it is no longer a member", x.Name)))
			}
		}
	}
	return errs
}
