from perseus.cli.main import entry

entry()
