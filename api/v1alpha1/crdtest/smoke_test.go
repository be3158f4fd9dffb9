package crdtest

import "testing"

func TestSmoke(t *testing.T) { _ = newNamespace(t) }
