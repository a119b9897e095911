"""The model runner: the only torch code. Import submodules directly
(`sluiceway.runner.loading`, `sluiceway.runner.model_runner`) so that importing this
package stays cheap."""
