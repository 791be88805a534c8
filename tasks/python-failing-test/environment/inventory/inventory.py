"""A tiny stock ledger."""


class Ledger:
    def __init__(self, items={}):
        self.items = items

    def add(self, sku, qty):
        if qty <= 0:
            raise ValueError("qty must be positive")
        self.items[sku] = self.items.get(sku, 0) + qty

    def remove(self, sku, qty):
        have = self.items.get(sku, 0)
        if qty > have:
            raise ValueError(f"only {have} of {sku} in stock")
        self.items[sku] = have - qty
        if self.items[sku] == 0:
            del self.items[sku]

    def total(self):
        return sum(self.items.values())
