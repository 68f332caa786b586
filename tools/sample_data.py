"""The bundled sample data: synthetic rows in Glaive function-calling v2's textual format.

Offline runs (`configs/finetune/tiny.yaml`, tests, speed runs) train on `assets/glaive_sample.jsonl`, which this
module generates deterministically from a seed: a catalogue of tool schemas, each with requests, plausible
function responses and follow-up answers, plus conversations without calls (chit-chat, refusals of requests the
tools cannot serve, rows without tools) and a few deliberately malformed rows that the parser must count.

It lives in tools/, not in the package: a run reads the shipped file, never this generator. Regenerate the file
(it must stay byte-identical to `generate_rows(SAMPLE_ROWS, SAMPLE_SEED)`, tests/finetune/test_sample_data.py
checks) and, with --tokenizer, the tiny tokenizer trained on it (`assets/tiny_tokenizer.json`,
finetune/data/tokenizer.py):

    python tools/sample_data.py [--tokenizer]
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucert.finetune.data.formats import SAMPLE_PATH
from gpucert.finetune.data.glaive import NO_TOOLS_PREAMBLE, TOOLS_PREAMBLE, parse_rows
from gpucert.finetune.data.template import template_text
from gpucert.finetune.data.tokenizer import TINY_TOKENIZER_PATH, train_tiny_tokenizer

SAMPLE_ROWS = 400
SAMPLE_SEED = 20261121
# Every MALFORMED_EVERY-th row (index % MALFORMED_EVERY == MALFORMED_EVERY - 1) is broken on purpose: the
# arguments quoting of a call, or a duplicated assistant turn. Glaive v2 has both kinds.
MALFORMED_EVERY = 40
EOT = " <|endoftext|>"


def expected_unparsable(n: int) -> int:
    return n // MALFORMED_EVERY


@dataclass(frozen=True)
class Exchange:
    """One tool use: what the user asks, the call's arguments, the function's answer, the assistant's reply.
    `vague` + `clarify` give a first request that lacks an argument and the assistant's question about it."""

    user: str
    arguments: dict[str, Any]
    response: dict[str, Any]
    answer: str
    vague: str | None = None
    clarify: str | None = None


@dataclass(frozen=True)
class Tool:
    schema: dict[str, Any]
    make: Callable[[random.Random], Exchange]
    # What the assistant says it can do when refusing an unrelated request.
    ability: str


def _schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }


def _p(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


CITIES = {
    "Paris": (48.857, 2.352, 1),
    "London": (51.507, -0.128, 0),
    "New York": (40.713, -74.006, -5),
    "Tokyo": (35.690, 139.692, 9),
    "Sydney": (-33.869, 151.209, 11),
    "Berlin": (52.520, 13.405, 1),
    "Toronto": (43.653, -79.383, -5),
    "Mumbai": (19.076, 72.878, 5.5),
    "Cape Town": (-33.925, 18.424, 2),
    "Mexico City": (19.433, -99.133, -6),
    "Seville": (37.389, -5.984, 1),
    "Reykjavik": (64.147, -21.942, 0),
    "Singapore": (1.352, 103.820, 8),
    "Chicago": (41.878, -87.630, -6),
    "Lisbon": (38.722, -9.139, 0),
}
CONDITIONS = ["sunny", "partly cloudy", "overcast", "light rain", "clear", "windy", "foggy", "thunderstorms"]
RATES_PER_USD = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.4, "CAD": 1.36, "AUD": 1.52, "INR": 83.2}


def _city(rng: random.Random) -> str:
    return rng.choice(sorted(CITIES))


def _weather(rng: random.Random) -> Exchange:
    city = _city(rng)
    unit = rng.choice(["celsius", "fahrenheit"])
    temp_c = rng.randint(-5, 34)
    temp = temp_c if unit == "celsius" else round(temp_c * 9 / 5 + 32)
    condition = rng.choice(CONDITIONS)
    symbol = "°C" if unit == "celsius" else "°F"
    user = rng.choice(
        [
            f"What's the weather like in {city} right now? Please give me the temperature in {unit}.",
            f"Can you check the current weather in {city}? I prefer {unit}.",
            f"I'm heading out in {city}. How warm is it, in {unit}?",
        ]
    )
    return Exchange(
        user=user,
        arguments={"location": city, "unit": unit},
        response={"location": city, "temperature": temp, "unit": unit, "condition": condition},
        answer=f"It is currently {temp}{symbol} and {condition} in {city}.",
        vague="What's the weather like today?",
        clarify="Sure, which city would you like the weather for?",
    )


def _currency(rng: random.Random) -> Exchange:
    src, dst = rng.sample(sorted(RATES_PER_USD), 2)
    amount = rng.choice([20, 50, 100, 250, 500, 1000, 1500])
    converted = round(amount / RATES_PER_USD[src] * RATES_PER_USD[dst], 2)
    user = rng.choice(
        [
            f"Hi, I need to convert {amount} {src} to {dst}. Can you help me with that?",
            f"How much is {amount} {src} in {dst}?",
            f"Please convert {amount} {src} into {dst} for me.",
        ]
    )
    return Exchange(
        user=user,
        arguments={"amount": amount, "from_currency": src, "to_currency": dst},
        response={"converted_amount": converted, "from_currency": src, "to_currency": dst},
        answer=f"Sure, {amount} {src} is approximately {converted} {dst}.",
        vague=f"I want to change some {src} into {dst}.",
        clarify=f"Of course. How many {src} would you like to convert?",
    )


EVENTS = ["Team meeting", "Dentist appointment", "Project review", "Lunch with Sam", "Yoga class", "Book club"]


def _calendar(rng: random.Random) -> Exchange:
    title = rng.choice(EVENTS)
    day = rng.randint(1, 28)
    month = rng.randint(1, 12)
    hour = rng.randint(8, 18)
    start = f"2026-{month:02d}-{day:02d}T{hour:02d}:00:00"
    end = f"2026-{month:02d}-{day:02d}T{hour + 1:02d}:00:00"
    user = (
        f"I need to create a new event in my calendar called '{title}' on 2026-{month:02d}-{day:02d} "
        f"from {hour}:00 to {hour + 1}:00."
    )
    return Exchange(
        user=user,
        arguments={"title": title, "start_time": start, "end_time": end},
        response={"status": "success", "message": f"Event '{title}' has been created for {start}"},
        answer=f"The event '{title}' has been added to your calendar on 2026-{month:02d}-{day:02d} at {hour}:00.",
        vague="Can you add something to my calendar?",
        clarify="Certainly. What is the title of the event, and when does it start and end?",
    )


def _bmi(rng: random.Random) -> Exchange:
    weight = rng.randint(48, 110)
    height = round(rng.uniform(1.5, 1.95), 2)
    bmi = round(weight / height**2, 1)
    band = "underweight" if bmi < 18.5 else "normal" if bmi < 25 else "overweight" if bmi < 30 else "obese"
    return Exchange(
        user=f"Hi, I would like to calculate my BMI. I weigh {weight} kilograms and my height is {height} meters.",
        arguments={"weight": weight, "height": height},
        response={"bmi": bmi},
        answer=f"Your Body Mass Index (BMI) is {bmi}, which falls in the {band} range.",
        vague="Can you calculate my BMI?",
        clarify="Sure! Please tell me your weight in kilograms and your height in meters.",
    )


TOPICS = ["electric bikes", "sourdough starters", "the James Webb telescope", "home composting", "chess openings"]


def _search(rng: random.Random) -> Exchange:
    topic = rng.choice(TOPICS)
    results = [
        {"title": f"A beginner's guide to {topic}", "url": f"https://example.org/{topic.split()[-1]}/guide"},
        {
            "title": f"{topic[0].upper() + topic[1:]}: what's new in 2026",
            "url": f"https://news.example.com/{rng.randint(100, 999)}",
        },
    ]
    return Exchange(
        user=f"Can you search the web for recent articles about {topic}?",
        arguments={"query": topic, "max_results": 2},
        response={"results": results},
        answer=f'Here is what I found: "{results[0]["title"]}" and "{results[1]["title"]}".',
    )


STOCKS = {
    "AAPL": "Apple",
    "MSFT": "Microsoft",
    "NVDA": "NVIDIA",
    "AMZN": "Amazon",
    "TSLA": "Tesla",
    "GOOGL": "Alphabet",
}


def _stock(rng: random.Random) -> Exchange:
    symbol = rng.choice(sorted(STOCKS))
    price = round(rng.uniform(80, 900), 2)
    return Exchange(
        user=rng.choice(
            [f"What's the current stock price of {STOCKS[symbol]}?", f"Hey, how is {symbol} trading right now?"]
        ),
        arguments={"symbol": symbol},
        response={"symbol": symbol, "price": price, "currency": "USD"},
        answer=f"The current stock price of {STOCKS[symbol]} ({symbol}) is ${price}.",
    )


UNITS = [("kilometers", "miles", 0.621371), ("pounds", "kilograms", 0.453592), ("liters", "gallons", 0.264172)]


def _units(rng: random.Random) -> Exchange:
    src, dst, factor = rng.choice(UNITS)
    value = rng.choice([3, 5, 10, 12, 26.2, 42, 100])
    result = round(value * factor, 2)
    return Exchange(
        user=f"How many {dst} is {value} {src}?",
        arguments={"value": value, "from_unit": src, "to_unit": dst},
        response={"result": result, "unit": dst},
        answer=f"{value} {src} is about {result} {dst}.",
    )


def _tip(rng: random.Random) -> Exchange:
    bill = rng.choice([24.5, 38, 56.75, 80, 112.4, 150])
    percent = rng.choice([10, 15, 18, 20, 25])
    tip = round(bill * percent / 100, 2)
    return Exchange(
        user=f"Hi, I need help calculating a tip. My bill is ${bill} and I want to leave {percent}%.",
        arguments={"bill_amount": bill, "tip_percentage": percent},
        response={"tip_amount": tip, "total": round(bill + tip, 2)},
        answer=f"A {percent}% tip on ${bill} is ${tip}, so the total comes to ${round(bill + tip, 2)}.",
        vague="How much should I tip?",
        clarify="I can work that out for you. What is the bill amount and what percentage would you like to tip?",
    )


AIRLINES = ["BA", "LH", "AF", "UA", "QF", "SQ", "AC"]


def _flight(rng: random.Random) -> Exchange:
    flight = f"{rng.choice(AIRLINES)}{rng.randint(10, 989)}"
    date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    status = rng.choice(["on time", "delayed by 35 minutes", "boarding", "landed", "cancelled"])
    gate = f"{rng.choice('ABCDE')}{rng.randint(1, 40)}"
    return Exchange(
        user=f"Can you check the status of flight {flight} on {date}?",
        arguments={"flight_number": flight, "date": date},
        response={"flight_number": flight, "status": status, "gate": gate},
        answer=f"Flight {flight} on {date} is {status}. It is assigned to gate {gate}.",
        vague="Is my flight on time?",
        clarify="I can check that. What is your flight number and the date of travel?",
    )


PHRASES = {
    ("I'm looking for the train station", "French"): "Je cherche la gare",
    ("Where's the nearest pharmacy?", "Spanish"): "¿Dónde está la farmacia más cercana?",
    ("Thank you for your help", "German"): "Vielen Dank für Ihre Hilfe",
    ("I'd like a coffee, please", "Italian"): "Vorrei un caffè, per favore",
    ("How much does this cost?", "Portuguese"): "Quanto custa isto?",
}


def _translate(rng: random.Random) -> Exchange:
    (text, language), translation = rng.choice(sorted(PHRASES.items()))
    return Exchange(
        user=f'Can you translate "{text}" into {language}?',
        arguments={"text": text, "target_language": language},
        response={"translated_text": translation, "source_language": "English"},
        answer=f'In {language}, "{text}" is "{translation}".',
    )


def _timezone(rng: random.Random) -> Exchange:
    city = _city(rng)
    offset = CITIES[city][2]
    hour, minute = rng.randint(0, 23), rng.choice([0, 15, 30, 45])
    sign = "+" if offset >= 0 else "-"
    hours = abs(offset)
    utc = f"UTC{sign}{int(hours):02d}:{round((hours % 1) * 60):02d}"
    return Exchange(
        user=rng.choice(
            [f"What time is it in {city} right now?", f"Which timezone is {city} in, and what's the time?"]
        ),
        arguments={"city": city},
        response={"city": city, "local_time": f"{hour:02d}:{minute:02d}", "utc_offset": utc},
        answer=f"It's {hour:02d}:{minute:02d} in {city} ({utc}).",
    )


RECIPES = {
    "chicken": ["Lemon garlic chicken", "Chicken tikka masala"],
    "tomatoes": ["Shakshuka", "Tomato basil soup"],
    "mushrooms": ["Mushroom risotto", "Creamy mushroom pasta"],
    "lentils": ["Red lentil dal", "Lentil shepherd's pie"],
}


def _recipes(rng: random.Random) -> Exchange:
    ingredient = rng.choice(sorted(RECIPES))
    diet = rng.choice(["none", "vegetarian", "gluten-free"])
    names = RECIPES[ingredient]
    args: dict[str, Any] = {"ingredients": [ingredient]}
    if diet != "none":
        args["diet"] = diet
    user = f"I have some {ingredient}. Can you find me a recipe?"
    if diet != "none":
        user = f"I have some {ingredient} and I eat {diet}. Any recipe ideas?"
    return Exchange(
        user=user,
        arguments=args,
        response={"recipes": [{"name": n, "time_minutes": rng.choice([20, 30, 45, 60])} for n in names]},
        answer=f"You could make {names[0]} or {names[1]}. Would you like the full instructions for one of them?",
    )


TASKS = ["call the plumber", "pick up the dry cleaning", "renew my passport", "water the plants", "pay the rent"]


def _reminder(rng: random.Random) -> Exchange:
    task = rng.choice(TASKS)
    when = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(7, 20):02d}:00:00"
    return Exchange(
        user=f"Remind me to {task} on {when[:10]} at {when[11:16]}.",
        arguments={"task": task, "remind_at": when},
        response={"status": "scheduled", "reminder_id": rng.randint(1000, 9999)},
        answer=f"Done! I'll remind you to {task} on {when[:10]} at {when[11:16]}.",
        vague="Can you set a reminder for me?",
        clarify="Of course. What should I remind you about, and when?",
    )


def _loan(rng: random.Random) -> Exchange:
    principal = rng.choice([5000, 12000, 25000, 200000, 350000])
    rate = rng.choice([3.5, 4.2, 5, 6.75, 8])
    years = rng.choice([3, 5, 15, 30])
    monthly_rate = rate / 100 / 12
    months = years * 12
    payment = round(principal * monthly_rate / (1 - (1 + monthly_rate) ** -months), 2)
    return Exchange(
        user=f"I'm considering a loan of ${principal} at an annual interest rate of {rate}% over {years} years. "
        "What would my monthly payment be?",
        arguments={"principal": principal, "annual_interest_rate": rate, "term_years": years},
        response={"monthly_payment": payment},
        answer=f"Your monthly payment would be about ${payment}.",
        vague="I want to know my monthly payment for a loan.",
        clarify="Sure. Could you tell me the loan amount, the annual interest rate and the term in years?",
    )


def _distance(rng: random.Random) -> Exchange:
    a, b = rng.sample(sorted(CITIES), 2)
    (lat1, lon1, _), (lat2, lon2, _) = CITIES[a], CITIES[b]
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    km = round(2 * 6371 * math.asin(math.sqrt(h)))
    return Exchange(
        user=rng.choice([f"How far is {a} from {b}?", f"What's the distance between {a} and {b}?"]),
        arguments={"origin": a, "destination": b},
        response={"distance_km": km},
        answer=f"The distance between {a} and {b} is approximately {km} kilometers as the crow flies.",
    )


STR, NUM, INT, ARR = "string", "number", "integer", "array"
CATALOGUE = [
    Tool(
        _schema(
            "get_current_weather",
            "Get the current weather for a location",
            {
                "location": _p(STR, "The city name, e.g. Paris"),
                "unit": _p(STR, "The temperature unit", enum=["celsius", "fahrenheit"]),
            },
            ["location"],
        ),
        _weather,
        "check the current weather",
    ),
    Tool(
        _schema(
            "convert_currency",
            "Convert an amount from one currency to another",
            {
                "amount": _p(NUM, "The amount to convert"),
                "from_currency": _p(STR, "The currency to convert from, e.g. USD"),
                "to_currency": _p(STR, "The currency to convert to, e.g. EUR"),
            },
            ["amount", "from_currency", "to_currency"],
        ),
        _currency,
        "convert currencies",
    ),
    Tool(
        _schema(
            "create_calendar_event",
            "Create a new event in the user's calendar",
            {
                "title": _p(STR, "The title of the event"),
                "start_time": _p(STR, "The start time in ISO 8601 format"),
                "end_time": _p(STR, "The end time in ISO 8601 format"),
            },
            ["title", "start_time", "end_time"],
        ),
        _calendar,
        "create calendar events",
    ),
    Tool(
        _schema(
            "calculate_bmi",
            "Calculate the Body Mass Index (BMI)",
            {"weight": _p(NUM, "The weight in kilograms"), "height": _p(NUM, "The height in meters")},
            ["weight", "height"],
        ),
        _bmi,
        "calculate your BMI",
    ),
    Tool(
        _schema(
            "search_web",
            "Search the web and return the top results",
            {"query": _p(STR, "The search query"), "max_results": _p(INT, "How many results to return")},
            ["query"],
        ),
        _search,
        "search the web",
    ),
    Tool(
        _schema(
            "get_stock_price",
            "Get the current stock price of a company",
            {"symbol": _p(STR, "The stock ticker symbol, e.g. AAPL")},
            ["symbol"],
        ),
        _stock,
        "look up stock prices",
    ),
    Tool(
        _schema(
            "convert_units",
            "Convert a value between units of length, weight or volume",
            {
                "value": _p(NUM, "The value to convert"),
                "from_unit": _p(STR, "The unit to convert from"),
                "to_unit": _p(STR, "The unit to convert to"),
            },
            ["value", "from_unit", "to_unit"],
        ),
        _units,
        "convert between units",
    ),
    Tool(
        _schema(
            "calculate_tip",
            "Calculate the tip amount for a bill",
            {
                "bill_amount": _p(NUM, "The total bill amount"),
                "tip_percentage": _p(NUM, "The percentage of tip to give"),
            },
            ["bill_amount", "tip_percentage"],
        ),
        _tip,
        "calculate tips",
    ),
    Tool(
        _schema(
            "get_flight_status",
            "Get the status of a flight",
            {
                "flight_number": _p(STR, "The flight number, e.g. BA117"),
                "date": _p(STR, "The date of the flight in YYYY-MM-DD format"),
            },
            ["flight_number", "date"],
        ),
        _flight,
        "check flight statuses",
    ),
    Tool(
        _schema(
            "translate_text",
            "Translate text into another language",
            {
                "text": _p(STR, "The text to translate"),
                "target_language": _p(STR, "The language to translate into"),
            },
            ["text", "target_language"],
        ),
        _translate,
        "translate text",
    ),
    Tool(
        _schema(
            "get_time_in_city",
            "Get the current local time and UTC offset of a city",
            {"city": _p(STR, "The name of the city")},
            ["city"],
        ),
        _timezone,
        "tell you the time in a city",
    ),
    Tool(
        _schema(
            "search_recipes",
            "Search for recipes by ingredients",
            {
                "ingredients": _p(ARR, "The ingredients to include", items={"type": "string"}),
                "diet": _p(STR, "An optional dietary restriction, e.g. vegetarian"),
            },
            ["ingredients"],
        ),
        _recipes,
        "search for recipes",
    ),
    Tool(
        _schema(
            "create_reminder",
            "Create a reminder for a task at a given time",
            {"task": _p(STR, "What to be reminded about"), "remind_at": _p(STR, "When, in ISO 8601 format")},
            ["task", "remind_at"],
        ),
        _reminder,
        "set reminders",
    ),
    Tool(
        _schema(
            "calculate_loan_payment",
            "Calculate the monthly payment of a loan",
            {
                "principal": _p(NUM, "The loan amount"),
                "annual_interest_rate": _p(NUM, "The annual interest rate in percent"),
                "term_years": _p(INT, "The loan term in years"),
            },
            ["principal", "annual_interest_rate", "term_years"],
        ),
        _loan,
        "calculate loan payments",
    ),
    Tool(
        _schema(
            "calculate_distance",
            "Calculate the distance between two cities",
            {"origin": _p(STR, "The starting city"), "destination": _p(STR, "The destination city")},
            ["origin", "destination"],
        ),
        _distance,
        "calculate distances between cities",
    ),
]

UNRELATED = [
    ("Can you order a large pepperoni pizza for me?", "order food"),
    ("Please book me a taxi to the airport.", "book taxis"),
    ("Could you send an email to my manager saying I'll be late?", "send emails"),
    ("Can you book a table for two at an Italian restaurant tonight?", "make restaurant reservations"),
    ("Please buy two tickets for the concert on Saturday.", "buy tickets"),
    ("Can you turn off the lights in my living room?", "control smart home devices"),
    ("Call my mother and tell her I'm on my way.", "make phone calls"),
]
THANKS = [
    ("Thank you, that's helpful!", "You're welcome! If you have any other questions, feel free to ask."),
    ("Great, thanks a lot.", "Happy to help! Let me know if there's anything else you need."),
    ("Perfect, that's all I needed.", "Glad I could help. Have a great day!"),
]
GREETINGS = [
    ("Hi there! How are you today?", "Hello! I'm doing well, thank you. How can I help you today?"),
    ("Good morning!", "Good morning! What can I do for you?"),
]
KNOWLEDGE = [
    (
        "What is photosynthesis?",
        "Photosynthesis is the process by which plants, algae and some bacteria use sunlight, water and carbon "
        "dioxide to make glucose and release oxygen.",
    ),
    (
        "Can you explain what a black hole is?",
        "A black hole is a region of space where gravity is so strong that nothing, not even light, can escape. "
        "It forms when a massive star collapses under its own gravity.",
    ),
    (
        "Who wrote 'Pride and Prejudice'?",
        "'Pride and Prejudice' was written by Jane Austen and published in 1813.",
    ),
    (
        "What's the difference between weather and climate?",
        "Weather describes short-term atmospheric conditions, such as today's rain, while climate is the average "
        "of those conditions over decades in a region.",
    ),
    (
        "How do vaccines work?",
        "Vaccines train the immune system by exposing it to a harmless piece or weakened form of a pathogen, so it "
        "can recognise and fight the real infection faster later.",
    ),
    (
        "What is the Pythagorean theorem?",
        "In a right triangle, the square of the hypotenuse equals the sum of the squares of the other two sides: "
        "a² + b² = c².",
    ),
    (
        "Why is the sky blue?",
        "Sunlight is scattered by the molecules in the air, and shorter blue wavelengths scatter much more than "
        "red ones (Rayleigh scattering), so the sky looks blue.",
    ),
    (
        "What does a CPU do?",
        "The CPU, or central processing unit, executes a program's instructions: arithmetic, logic, and moving "
        "data between memory and other devices.",
    ),
    (
        "Can you suggest a good way to start learning to code?",
        "Pick one beginner-friendly language such as Python, follow a structured course, and build small projects "
        "that interest you. Practising a little every day helps more than occasional long sessions.",
    ),
    (
        "What is the capital of Australia?",
        "The capital of Australia is Canberra.",
    ),
    (
        "How many bones are in the adult human body?",
        "An adult human body has 206 bones.",
    ),
    (
        "What causes the seasons on Earth?",
        "The seasons are caused by the tilt of Earth's axis, about 23.4 degrees, which changes how directly "
        "sunlight hits each hemisphere during the year.",
    ),
]
FOLLOW_UPS = [
    (
        "Interesting! Can you tell me more?",
        "Certainly. The key idea is that it is a well-studied process, and "
        "there are many good introductory books and articles if you'd like to go deeper.",
    ),
    ("Thanks, that makes sense.", "You're welcome! Let me know if you have more questions."),
]
NO_TOOL_REQUESTS = [
    ("Can you book a flight from Paris to Rome for me?", "book flights"),
    ("Please order me a new phone charger.", "place orders"),
    ("Set an alarm for 6 AM.", "set alarms"),
]


def _system(tools: list[Tool]) -> str:
    if not tools:
        return f"SYSTEM: {NO_TOOLS_PREAMBLE}"
    listing = "\n\n".join(json.dumps(tool.schema, indent=4, ensure_ascii=False) for tool in tools)
    return f"SYSTEM: {TOOLS_PREAMBLE}\n{listing}"


def _call(name: str, arguments: dict[str, Any], python_literal: bool = False) -> str:
    # Glaive's quirk: the arguments object sits in single quotes, as a string, so the line is not JSON. Some
    # rows hold a Python literal ({'key': 'value'}) there instead of JSON.
    args = repr(arguments) if python_literal else json.dumps(arguments, ensure_ascii=False)
    return f'<functioncall> {{"name": "{name}", "arguments": \'{args}\'}}'


def _user(text: str) -> str:
    return f"USER: {text}"


def _assistant(text: str) -> str:
    return f"ASSISTANT: {text}{EOT}"


def _response(payload: dict[str, Any]) -> str:
    return f"FUNCTION RESPONSE: {json.dumps(payload, ensure_ascii=False)}"


def _tool_use(tool: Tool, exchange: Exchange, rng: random.Random, clarify: bool) -> list[str]:
    name = tool.schema["name"]
    turns = []
    if clarify and exchange.vague and exchange.clarify:
        turns += [_user(exchange.vague), _assistant(exchange.clarify), _user(exchange.user)]
    else:
        turns.append(_user(exchange.user))
    style = rng.random()
    if style < 0.15:
        # Prose, then the call as a second ASSISTANT turn: the parser merges them into one message.
        turns += [_assistant("Sure, let me check that for you."), _assistant(_call(name, exchange.arguments))]
    elif style < 0.25:
        turns.append(_assistant("Let me look that up. " + _call(name, exchange.arguments)))
    elif style < 0.3:
        turns.append(_assistant(_call(name, exchange.arguments, python_literal=True)))
    else:
        turns.append(_assistant(_call(name, exchange.arguments)))
    turns += [_response(exchange.response), _assistant(exchange.answer)]
    return turns


def _tool_row(rng: random.Random) -> dict[str, str]:
    tools = rng.sample(CATALOGUE, rng.choice([1, 1, 1, 2, 2, 3]))
    turns: list[str] = []
    if rng.random() < 0.1:
        turns += [_user(g) if i == 0 else _assistant(g) for i, g in enumerate(rng.choice(GREETINGS))]
    kind = rng.random()
    if kind < 0.15:
        # A request none of the tools serves: the answer is a refusal that names what the tools can do.
        request, action = rng.choice(UNRELATED)
        abilities = " and ".join(tool.ability for tool in tools)
        turns += [
            _user(request),
            _assistant(
                f"I'm sorry, but I'm unable to {action} as that's an external task and I don't have a function "
                f"for it. I can help you {abilities}."
            ),
        ]
    else:
        first = tools[0]
        turns += _tool_use(first, first.make(rng), rng, clarify=rng.random() < 0.2)
        if rng.random() < 0.35:
            second = rng.choice(tools)
            turns += _tool_use(second, second.make(rng), rng, clarify=False)
    if rng.random() < 0.3:
        thanks = rng.choice(THANKS)
        turns += [_user(thanks[0]), _assistant(thanks[1])]
    return {"system": _system(tools), "chat": "\n\n\n".join(turns)}


def _plain_row(rng: random.Random) -> dict[str, str]:
    turns: list[str] = []
    if rng.random() < 0.25:
        request, action = rng.choice(NO_TOOL_REQUESTS)
        turns += [
            _user(request),
            _assistant(
                f"I'm sorry, but I don't have the capability to {action}. My current functions are limited. "
                "Is there anything else I can help you with?"
            ),
        ]
    else:
        for question, answer in rng.sample(KNOWLEDGE, rng.choice([1, 1, 2])):
            turns += [_user(question), _assistant(answer)]
        if rng.random() < 0.3:
            follow = rng.choice(FOLLOW_UPS)
            turns += [_user(follow[0]), _assistant(follow[1])]
    return {"system": _system([]), "chat": "\n\n\n".join(turns)}


def _malformed_row(rng: random.Random, index: int) -> dict[str, str]:
    tool = rng.choice(CATALOGUE)
    exchange = tool.make(rng)
    name = tool.schema["name"]
    good_call = _call(name, exchange.arguments)
    if (index // MALFORMED_EVERY) % 2 == 0:
        # The closing brace of the arguments object is missing: neither JSON nor a Python literal.
        args = json.dumps(exchange.arguments, ensure_ascii=False)[:-1]
        call = f'<functioncall> {{"name": "{name}", "arguments": \'{args}\'}}'
        turns = [_user(exchange.user), _assistant(call), _response(exchange.response), _assistant(exchange.answer)]
    else:
        # The same call repeated as two consecutive assistant turns.
        turns = [
            _user(exchange.user),
            _assistant(good_call),
            _assistant(good_call),
            _response(exchange.response),
            _assistant(exchange.answer),
        ]
    return {"system": _system([tool]), "chat": "\n\n\n".join(turns)}


def generate_rows(n: int = SAMPLE_ROWS, seed: int = SAMPLE_SEED) -> list[dict[str, str]]:
    """n Glaive-format rows ({"system", "chat"}), the same for the same (n, seed)."""
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        if index % MALFORMED_EVERY == MALFORMED_EVERY - 1:
            rows.append(_malformed_row(rng, index))
        elif rng.random() < 0.2:
            rows.append(_plain_row(rng))
        else:
            rows.append(_tool_row(rng))
    return rows


def to_jsonl(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps({"system": r["system"], "chat": r["chat"]}, ensure_ascii=False) + "\n" for r in rows)


def write_sample(path: Path = SAMPLE_PATH, n: int = SAMPLE_ROWS, seed: int = SAMPLE_SEED) -> None:
    path.write_text(to_jsonl(generate_rows(n, seed)), encoding="utf-8")


def sample_texts() -> list[str]:
    """The bundled sample rendered with the Qwen2.5 tool template: the tiny tokenizer's training corpus."""
    from transformers.utils.chat_template_utils import render_jinja_template

    render: Any = render_jinja_template  # returns (texts, generation spans), not the annotated str

    conversations, _ = parse_rows(generate_rows())
    template = template_text("qwen2.5-tools")
    texts = []
    for conv in conversations:
        rendered, _ = render(conversations=[conv.messages], tools=conv.tools or None, chat_template=template)
        texts.append(rendered[0])
    return texts


def build_tiny_tokenizer(path: Path = TINY_TOKENIZER_PATH) -> None:
    train_tiny_tokenizer(sample_texts(), path)


if __name__ == "__main__":
    import sys

    write_sample()
    if "--tokenizer" in sys.argv[1:]:
        build_tiny_tokenizer()
