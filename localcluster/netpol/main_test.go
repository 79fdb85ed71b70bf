package main

import (
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The host is added to every rule that lists sources, and to no other: a rule without sources admits everyone
// already, and a policy without rules (deny all) stays so.
func TestAdmittingAddsTheHostToRulesWithSources(t *testing.T) {
	jobPods := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}}
	policy := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
		{From: []networkingv1.NetworkPolicyPeer{jobPods}},
		{},
	}}}
	got, err := admitting("10.244.0.1/32")(policy)
	if err != nil {
		t.Fatal(err)
	}
	rules := got.(*networkingv1.NetworkPolicy).Spec.Ingress
	if len(rules[0].From) != 2 || rules[0].From[1].IPBlock == nil || rules[0].From[1].IPBlock.CIDR != "10.244.0.1/32" {
		t.Errorf("the rule with sources: %+v", rules[0].From)
	}
	if len(rules[1].From) != 0 {
		t.Errorf("the rule without sources got some: %+v", rules[1].From)
	}
	if len(policy.Spec.Ingress[0].From) != 1 {
		t.Errorf("the informer's object was changed in place: %+v", policy.Spec.Ingress[0].From)
	}
	empty, _ := admitting("10.244.0.1/32")(&networkingv1.NetworkPolicy{})
	if len(empty.(*networkingv1.NetworkPolicy).Spec.Ingress) != 0 {
		t.Errorf("a policy without rules got one")
	}
}
