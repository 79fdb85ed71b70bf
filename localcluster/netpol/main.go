// kube-network-policies for the local cluster's real nodes: upstream's controller
// (sigs.k8s.io/kube-network-policies/pkg/networkpolicy, the NetworkPolicy implementation kind ships), run in
// one node's network namespace. Upstream's main reads only the in-cluster config (a pod's ServiceAccount
// files), while here it runs as a node process, as the kubelet and kube-proxy do: this main differs from
// upstream's cmd/main.go only in taking a kubeconfig, in admitting the host (--admit-cidr), and in diverting
// packets with iptables where the kernel lacks nftables' queue expression (--iptables-divert).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	networkingv1 "k8s.io/api/networking/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"

	"golang.org/x/sys/unix"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the node's credentials")
	nodeName := flag.String("hostname-override", "", "the name of the Node this instance enforces policies on")
	metrics := flag.String("metrics-bind-address", "", "address of the /metrics endpoint (off when empty)")
	queueID := flag.Int("nfqueue-id", 100, "the nfqueue the first packets of connections go to")
	admit := flag.String("admit-cidr", "", "a CIDR every ingress rule with sources also admits (the host)")
	divert := flag.String("iptables-divert", "", "the pods' CIDR: divert their new connections to the queue with "+
		"iptables' NFQUEUE (for kernels without CONFIG_NFT_QUEUE, where upstream's nftables rules do not load)")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *nodeName, *metrics, *queueID, *admit, *divert); err != nil {
		fmt.Fprintf(os.Stderr, "kube-network-policies: %v\n", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, metrics string, queueID int, admit, divert string) error {
	if nodeName == "" {
		return fmt.Errorf("--hostname-override is required")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, unix.SIGTERM)
	defer cancel()
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(clientset, 0)
	policies := factory.Networking().V1().NetworkPolicies()
	if admit != "" {
		if err := policies.Informer().SetTransform(admitting(admit)); err != nil {
			return err
		}
	}
	if metrics != "" {
		http.Handle("/metrics", promhttp.Handler())
		go func() { utilruntime.HandleError(http.ListenAndServe(metrics, nil)) }()
	}
	controller, err := networkpolicy.NewController(clientset, policies, factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(), nil, nil, nil, nil, networkpolicy.Config{
			// NRI stays on although containerd 1.6 serves none (its plugin logs that it exited): with it off,
			// v0.8.0 asks its nil NRI plugin about every address that is no pod's, and panics.
			QueueID: queueID, NodeName: nodeName, NetfilterBug1766Fix: true,
		})
	if err != nil {
		return err
	}
	go func() { utilruntime.HandleError(controller.Run(ctx)) }()
	factory.Start(ctx.Done())
	if divert != "" {
		// After the caches, as the controller opens its queue then: no listener meanwhile drops the packets.
		factory.WaitForCacheSync(ctx.Done())
		if err := iptables(divertRules(divert, queueID)); err != nil {
			return err
		}
		defer func() { _ = iptables(undivertRules()) }()
	}
	<-ctx.Done()
	return nil
}

const divertChain = "KUBE-NETWORK-POLICIES"

// divertRules are upstream's postrouting chain (controller.go, syncNFTablesRules) in iptables' words: the node's
// own root processes and established connections pass, every other packet to or from a pod goes to the queue,
// whose answer comes from the policies. Without upstream's set of the pods that policies select, every pod's
// new connections are asked about (a pod no policy selects is admitted). No DNS exception: it worked around a
// conntrack race fixed in kernel 6.12.
func divertRules(podCIDR string, queueID int) [][]string {
	queue := []string{"-j", "NFQUEUE", "--queue-num", strconv.Itoa(queueID)}
	rules := undivertRules()
	rules = append(rules,
		[]string{"-N", divertChain},
		[]string{"-A", divertChain, "-m", "owner", "--uid-owner", "0", "-j", "RETURN"},
		[]string{"-A", divertChain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"},
		append([]string{"-A", divertChain, "-s", podCIDR}, queue...),
		append([]string{"-A", divertChain, "-d", podCIDR}, queue...),
		[]string{"-A", "POSTROUTING", "-j", divertChain},
	)
	return rules
}

// undivertRules remove the chain, and are also run before making it (one left by a killed instance).
func undivertRules() [][]string {
	return [][]string{{"-D", "POSTROUTING", "-j", divertChain}, {"-F", divertChain}, {"-X", divertChain}}
}

func iptables(rules [][]string) error {
	for _, rule := range rules {
		out, err := exec.Command("iptables", append([]string{"-w", "-t", "mangle"}, rule...)...).CombinedOutput()
		if err != nil && rule[0] != "-D" && rule[0] != "-F" && rule[0] != "-X" {
			return fmt.Errorf("iptables -t mangle %v: %v: %s", rule, err, out)
		}
	}
	return nil
}

// admitting adds cidr to the sources of every ingress rule that lists sources. The host is this cluster's
// control-plane node, where an operator run as a process (the soak, the tests that lose a node) and the tests
// themselves reach pods from; no pod can answer from its address.
func admitting(cidr string) func(any) (any, error) {
	return func(obj any) (any, error) {
		policy, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok {
			return obj, nil
		}
		policy = policy.DeepCopy()
		policy.ManagedFields = nil
		for i := range policy.Spec.Ingress {
			if len(policy.Spec.Ingress[i].From) > 0 {
				policy.Spec.Ingress[i].From = append(policy.Spec.Ingress[i].From,
					networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr}})
			}
		}
		return policy, nil
	}
}
