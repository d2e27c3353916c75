"""ncpsim's cluster DNS: the wildcard rule (pure), the asyncio resolver, the stub client and the
CoreDNS rewrite rendering. This package shadows dnspython's `dns`; ncpsim never imports dnspython.
"""
