// kstatus prints what sigs.k8s.io/cli-utils/pkg/kstatus/status computes for Kubernetes objects,
// the library Flux (`wait: true`, healthChecks) and `kubectl`-style tools use to decide whether a
// resource is Current, InProgress or Failed. The tests feed it live objects from the test API
// server, so the project's conditions are judged by the real library, not by a re-implementation.
//
// Input: one JSON object, or a List (`kubectl get -o json`), on stdin.
// Output: one JSON line per object: {"name", "status", "message"}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(data); err != nil {
		fail(err)
	}
	objects := []unstructured.Unstructured{u}
	if u.IsList() {
		list, err := u.ToList()
		if err != nil {
			fail(err)
		}
		objects = list.Items
	}
	out := json.NewEncoder(os.Stdout)
	for i := range objects {
		result, err := status.Compute(&objects[i])
		if err != nil {
			fail(err)
		}
		if err := out.Encode(verdict{objects[i].GetName(), result.Status.String(), result.Message}); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(1)
}
