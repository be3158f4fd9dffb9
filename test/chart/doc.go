// Package chart renders the druid-stretch Helm chart (charts/druid-stretch)
// with the Helm SDK, exactly as `helm install` would, and puts what it renders
// on a real kube-apiserver: the tests in this package show that every
// rendered object is accepted, that bad values fail with a message naming the
// value, that the chart's ServiceAccount can do the controller's work and
// nothing more, and that the API server routes exactly the intended requests
// to the chart's webhooks.
//
// The exported helpers are for other end-to-end tests too: render the chart
// (Render), create its objects (Create, InstallCRDs), act as its
// ServiceAccount (ImpersonateServiceAccount), run the controller with the
// chart's flags (Rendered.ControllerArgs), and point the chart's webhook
// configurations at a webhook server running in the test (PointWebhooksAt).
package chart
